"""The membership merge over several routers: member lists, join/leave, suspects.

:func:`merge_members` is what :meth:`RouterStub.members` returns; :class:`Presence` merges the
join/leave events of watched groups; :class:`SuspectFilter` delivers one suspect per member.

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

from collections import OrderedDict
from collections.abc import Sequence

from gossiprouter.client.errors import RouterError, StubError
from gossiprouter.client.model import Member
from gossiprouter.client.status import RouterAddress
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


class Presence:
    """Which routers report each member of each watched group: join/leave merged over routers.

    A member joins (for the application) when a first router reports it, and leaves when the
    last router that reported it reports its leave; the other reports are duplicates
    (counted by the caller). A lost connection's reports are forgotten silently
    (:meth:`forget_router`): what that router said is no longer known, not a leave.
    """

    def __init__(self, window: float = 5.0) -> None:
        self._where: dict[str, dict[bytes, set[RouterAddress]]] = {}
        # Leaves announced lately: a router that never reported the member (it registered
        # there before the watch) still reports its leave, a duplicate within this window.
        self._left = SuspectFilter(window)

    def join(self, group: str, addr: bytes, router: RouterAddress) -> bool:
        """``router`` reports ``addr`` in ``group``; True if no router reported it before."""
        where = self._where.setdefault(group, {}).setdefault(addr, set())
        first = not where
        where.add(router)
        return first

    def leave(self, group: str, addr: bytes, router: RouterAddress, now: float) -> bool:
        """``router`` reports ``addr`` gone at ``now``; True if no router reports it any more.

        A member no router reported (it joined before the watch) is news once: the leave that
        other routers report within the window is a duplicate."""
        presence = self._where.setdefault(group, {})
        where = presence.get(addr)
        if where is None:
            return self._left.first(group, addr, now)
        where.discard(router)
        if where:
            return False
        del presence[addr]
        self._left.first(group, addr, now)
        return True

    def forget_group(self, group: str) -> None:
        """The group is no longer watched."""
        self._where.pop(group, None)

    def forget_router(self, router: RouterAddress) -> None:
        """The connection to ``router`` is gone: drop what it reported, announcing nothing."""
        for presence in self._where.values():
            for addr in [a for a, where in presence.items() if router in where]:
                presence[addr].discard(router)
                if not presence[addr]:
                    del presence[addr]

    def members(self, group: str) -> dict[bytes, frozenset[RouterAddress]]:
        """Who is present in ``group``, and which routers report each (for tests, debugging)."""
        return {a: frozenset(w) for a, w in self._where.get(group, {}).items()}


class SuspectFilter:
    """One ``suspect`` per member per ``window`` seconds, however many routers report it.

    Every router that loses a member reports it, typically milliseconds apart; the
    application hears it once. O(1) per call, amortised, whatever the number of suspects:
    the entries are kept in the order they were last reported (``now`` never goes back), so
    the expired ones are the oldest and go from the front, each once. (A rebuild of the
    whole table on every call past ``max_entries`` made 16,384 suspects, one member's
    addresses when it drops its connection, hold the event loop for seconds: issue 31.)
    Bounded by what ``window`` lets in; ``max_entries`` is kept for callers that set it, as
    the size past which expired entries are looked for.
    """

    def __init__(self, window: float, max_entries: int = 1000) -> None:
        self.window = window
        self.max_entries = max_entries
        # (group, addr) -> when it was last news, oldest first (an OrderedDict: its front is
        # found and removed in O(1), where a dict's front after many deletions is not)
        self._last: OrderedDict[tuple[str, bytes], float] = OrderedDict()

    def first(self, group: str, addr: bytes, now: float) -> bool:
        """True if this suspect is news at ``now``; False for a duplicate within the window."""
        key = (group, addr)
        last = self._last.get(key)
        if last is not None and now - last < self.window:
            return False
        if len(self._last) > self.max_entries:
            self._expire(now)
        self._last[key] = now
        self._last.move_to_end(key)  # the order stays "oldest first"
        return True

    def _expire(self, now: float) -> None:
        """Drop the expired entries from the front; stops at the first one still fresh."""
        last = self._last
        while last:
            when = next(iter(last.values()))
            if now - when < self.window:
                return
            last.popitem(last=False)

    def __len__(self) -> int:
        return len(self._last)
