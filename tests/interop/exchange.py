"""The interop tests' message exchange: every member multicasts, and unicasts to the next
member round the ring; then every member must have got it all exactly once, in order.

Used by tests/interop/test_jgroups212.py (three members on one router) and
tests/interop/test_federation212.py (two members, each on its own federated router: for two,
the next member round the ring is the other one).
"""

from __future__ import annotations

from collections.abc import Sequence

from .harness import JavaNode, expected_texts, summarize_counts, wait_until


def ring(members: Sequence[JavaNode]) -> dict[str, JavaNode]:
    """Each member's successor, by name: the member it unicasts to."""
    return {n.name: members[(i + 1) % len(members)] for i, n in enumerate(members)}


def send_ring_traffic(members: Sequence[JavaNode], count: int) -> None:
    """All at once: each member multicasts ``count`` texts ``m<name>-i``, then unicasts
    ``count`` texts ``u<name>-i`` to its successor."""
    successor = ring(members)
    for n in members:
        n.send_command(f"MCAST {count} m{n.name}")
        n.send_command(f"UCAST {successor[n.name].name} {count} u{n.name}")


async def wait_ring_traffic(members: Sequence[JavaNode], count: int, timeout: float,
                            what: str) -> None:
    """Until every member got ``count`` multicasts from each member and ``count`` unicasts
    from its predecessor; on timeout, an AssertionError with ``what`` and the counts."""
    successor = ring(members)
    mprefixes = [f"m{n.name}" for n in members]
    uprefixes = [f"u{n.name}" for n in members]
    await wait_until(
        lambda: (
            all(r.received_count(p) >= count for r in members for p in mprefixes)
            and all(successor[s.name].received_count(f"u{s.name}") >= count for s in members)
        ),
        timeout,
        lambda: what + summarize_counts(members, mprefixes + uprefixes),
    )


def assert_ring_traffic_exact(members: Sequence[JavaNode], count: int) -> None:
    """Every member got each member's multicasts and its predecessor's unicasts exactly
    once, in order, nothing lost."""
    successor = ring(members)
    for receiver in members:
        for sender in members:
            got = receiver.received(sender=sender.name, prefix=f"m{sender.name}")
            assert got == expected_texts(f"m{sender.name}", count), (
                f"{receiver.name} got {len(got)} multicasts from {sender.name} "
                f"(expected {count}, in order, no duplicates)"
            )
        predecessor = next(s for s in members if successor[s.name] is receiver)
        got = receiver.received(sender=predecessor.name, prefix=f"u{predecessor.name}")
        assert got == expected_texts(f"u{predecessor.name}", count), (
            f"{receiver.name} got {len(got)} unicasts from {predecessor.name}"
        )
