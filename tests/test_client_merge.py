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
from gossiprouter.client.merge import Presence, SuspectFilter, merge_members
from gossiprouter.client.model import Member
from gossiprouter.protocol import native as wire
from tests.stubkit import CountedTime

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


R1 = ("10.0.0.1", 12001)
R2 = ("10.0.0.2", 12001)

# (report, expected: is it news for the application?) in order, over one watched group "g".
PRESENCE_CASES: dict[str, list[tuple[tuple[str, bytes, tuple[str, int]], bool]]] = {
    "a join reported by two routers is announced once":
        [(("join", b"A", R1), True), (("join", b"A", R2), False)],
    "a leave is announced when the last router reports it":
        [(("join", b"A", R1), True), (("join", b"A", R2), False),
         (("leave", b"A", R1), False), (("leave", b"A", R2), True)],
    "a re-join after a leave is announced again":
        [(("join", b"A", R1), True), (("leave", b"A", R1), True), (("join", b"A", R1), True)],
    "the same router reporting a join twice is one presence":
        [(("join", b"A", R1), True), (("join", b"A", R1), False), (("leave", b"A", R1), True)],
    "a leave of an unknown member is passed on, once":
        [(("leave", b"B", R1), True), (("leave", b"B", R2), False)],
    "a member only one router reported joining leaves once (it joined the other before the "
    "watch; both report its leave)":
        [(("join", b"A", R1), True), (("leave", b"A", R1), True), (("leave", b"A", R2), False)],
    "members are independent":
        [(("join", b"A", R1), True), (("join", b"B", R2), True), (("leave", b"A", R1), True)],
}


@pytest.mark.parametrize("reports", PRESENCE_CASES.values(), ids=PRESENCE_CASES.keys())
def test_presence_merges_join_and_leave(
        reports: list[tuple[tuple[str, bytes, tuple[str, int]], bool]]) -> None:
    p = Presence()
    for (kind, addr, router), news in reports:
        got = p.join("g", addr, router) if kind == "join" else p.leave("g", addr, router, 100.0)
        assert got is news, (kind, addr, router)


def test_presence_dedupes_unknown_leaves_within_the_window() -> None:
    p = Presence(window=5.0)
    assert p.leave("g", b"B", R1, 100.0) is True
    assert p.leave("g", b"B", R2, 100.1) is False
    assert p.leave("g", b"B", R2, 106.0) is True  # past the window: a new leave


def test_presence_forgets_a_lost_router_silently() -> None:
    p = Presence()
    p.join("g", b"A", R1)
    p.join("g", b"A", R2)
    p.join("g", b"B", R1)
    p.forget_router(R1)
    assert p.members("g") == {b"A": frozenset({R2})}
    # B is unknown now: its join through the next connection is news again.
    assert p.join("g", b"B", R2) is True
    # A is still reported by R2: R1's reconnect re-reporting it is a duplicate.
    assert p.join("g", b"A", R1) is False
    p.forget_group("g")
    assert p.members("g") == {}


def test_suspect_filter_delivers_one_suspect_per_window() -> None:
    f = SuspectFilter(window=5.0, max_entries=2)
    assert f.first("g", b"A", 100.0) is True
    assert f.first("g", b"A", 100.01) is False  # the second router's report
    assert f.first("h", b"A", 100.02) is True  # another group
    assert f.first("g", b"A", 105.0) is True  # past the window: a new suspect
    # Bounded: past max_entries, the expired entries are dropped.
    f.first("g", b"B", 106.0)
    f.first("g", b"C", 120.0)
    assert len(f) <= 2
    assert f.first("g", b"C", 120.5) is False  # the fresh entry survived the clean-up


def test_suspect_filter_is_linear_in_the_number_of_suspects() -> None:
    """100,000 suspects (one member's addresses dropping with its connection, and more), then
    as many again once the first are expired: the work is O(n), counted, never timed. The
    old filter rebuilt its table on every call past max_entries: n * n / 2 entries looked at."""
    n = 100_000
    CountedTime.reset(budget=6 * n)
    f = SuspectFilter(window=5.0)
    addrs = [i.to_bytes(4, "big") for i in range(n)]
    assert all(f.first("g", a, CountedTime(100.0 + i * 1e-6)) for i, a in enumerate(addrs))
    assert len(f) == n
    # The second router's reports: all duplicates.
    assert not any(f.first("g", a, CountedTime(100.5)) for a in addrs)
    # Past the window, the same addresses are news again, and the old entries went.
    assert all(f.first("g", a, CountedTime(200.0 + i * 1e-6)) for i, a in enumerate(addrs))
    assert len(f) == n
    assert CountedTime.calls <= 6 * n
