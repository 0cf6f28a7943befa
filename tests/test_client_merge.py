"""The member-list merge over several routers (gossiprouter.client.merge), without sockets.

Each case is the answers of the routers, in arrival order (an OK with members, or an error),
and the list RouterStub.members() must return, or the error it must raise.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gossiprouter.client.errors import (
    ConnectionLostError,
    ForbiddenError,
    RequestTimeoutError,
    StubError,
)
from gossiprouter.client.merge import merge_members
from gossiprouter.client.model import Member
from gossiprouter.protocol import native as wire

A = wire.MemberInfo(b"A", "a", (("10.0.0.1", 7800),))
A_ELSEWHERE = wire.MemberInfo(b"A", "a-other", (("10.0.0.9", 7800),))
B = wire.MemberInfo(b"B", None, ())
C = wire.MemberInfo(b"C", "c", ())
LOST = ConnectionLostError("connection to 127.0.0.1:1 lost")
SLOW = RequestTimeoutError("no answer")
REFUSED = ForbiddenError("forbidden", "group not allowed")


def ok(*members: wire.MemberInfo) -> wire.Ok:
    return wire.Ok(1, members)


def member(m: wire.MemberInfo) -> Member:
    return Member(m.addr, m.name, m.physical)


@dataclass
class Case:
    name: str
    answers: list[wire.Ok | StubError]
    members: list[Member] | None = None
    raises: StubError | None = None


CASES = [
    Case("one router: its list as it is", [ok(A, B)], [member(A), member(B)]),
    Case("several routers: the union, in arrival order", [ok(A), ok(B, C)],
         [member(A), member(B), member(C)]),
    Case("an address on two routers is listed once, as the first router names it",
         [ok(A, B), ok(A_ELSEWHERE, C)], [member(A), member(B), member(C)]),
    Case("a member only the second router knows is kept", [ok(B), ok(B, A)],
         [member(B), member(A)]),
    Case("an empty group is an empty list", [ok(), ok()], []),
    Case("an OK without a member list counts as empty", [wire.Ok(1), ok(A)], [member(A)]),
    Case("a failed router is skipped while another answers", [LOST, ok(A), SLOW], [member(A)]),
    Case("a refusing router is skipped while another answers", [ok(B), REFUSED], [member(B)]),
    Case("all failed: a router's refusal is the error, not the lost connection",
         [LOST, REFUSED, SLOW], raises=REFUSED),
    Case("all failed without a refusal: the first error", [SLOW, LOST], raises=SLOW),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_merge(case: Case) -> None:
    if case.raises is not None:
        with pytest.raises(StubError) as info:
            merge_members(case.answers)
        assert info.value is case.raises
        return
    got = merge_members(case.answers)
    assert got == case.members
    # Member equality ignores nothing: the name and physical addresses come from the first.
    assert [(m.name, m.physical) for m in got] == [(m.name, m.physical) for m in case.members or []]


def test_no_router_asked_is_an_empty_list() -> None:
    # members() waits for a connected router first; the merge of no answers is no members.
    assert merge_members([]) == []
