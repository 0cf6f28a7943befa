"""The membership merge over several routers: what :meth:`RouterStub.members` returns.

Pure: no trio, no sockets. Every connected router answers GET_MEMBERS on its own (an OK with
its member list, or an error); the stub shows one list:

* the union of the lists, deduplicated by logical address, in the order the answers came
  (the first router to name an address gives its name and physical addresses);
* routers that failed are skipped as long as one answered;
* when every router failed, the error is the first router ERROR (a refusal says more than a
  lost connection or a timeout), else the first error.

Tested without sockets in tests/test_client_merge.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from gossiprouter.client.errors import RouterError, StubError
from gossiprouter.client.model import Member
from gossiprouter.protocol import native as wire


def merge_members(answers: Sequence[wire.Ok | StubError]) -> list[Member]:
    """One member list from every router's answer; raises when no router answered."""
    seen: dict[bytes, Member] = {}
    errors: list[StubError] = []
    for a in answers:
        if isinstance(a, StubError):
            errors.append(a)
            continue
        for m in a.members or ():
            if m.addr not in seen:
                seen[m.addr] = Member(m.addr, m.name, m.physical)
    if errors and len(errors) == len(answers):
        raise next((e for e in errors if isinstance(e, RouterError)), errors[0])
    return list(seen.values())
