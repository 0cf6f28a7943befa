"""The run's timeline, in Python (no Spark): its clock (nanoseconds, :data:`NS_PER_S`), the
membership intervals (who was a member of which group when: :func:`membership_intervals`),
the router outages (when a loss happened across a reconnect: :func:`router_outages`) and
when the run ended (:func:`run_end`). The ROUTE audit reads them from the membership
records and the manifest before it pairs messages with their expected receivers
(:mod:`gossiprouter.analytics.deliveries`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["NS_PER_S", "Interval", "manifest_int", "membership_intervals", "router_outages",
           "run_end"]


NS_PER_S: Final = 1_000_000_000


@dataclass(frozen=True)
class Interval:
    """A span during which ``member`` belonged to ``group``: [start_ns, end_ns], end None if
    it never ended; next_start_ns is the start of the member's next interval, if any."""

    group: str
    member: str
    start_ns: int
    end_ns: int | None
    next_start_ns: int | None
    status: str
    """How the member's membership of the group ended in the run: "killed" if it was ever
    killed, else "left" if it ever left, else "stayed"."""


def membership_intervals(
    events: Iterable[tuple[int, str, str, str]],
) -> tuple[list[Interval], list[str]]:
    """Turn (t_ns, group, member, event) rows into membership intervals, plus warnings.

    Events are taken in time order (ties keep their order in ``events``). A join while
    already a member, and a leave/killed while not a member, are ignored with a warning.
    Intervals that touch (a rejoin at the very nanosecond of the leave) are merged, so the
    intervals of one member are strictly disjoint.
    """
    by_member: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for t_ns, group, member, event in events:
        by_member.setdefault((group, member), []).append((t_ns, event))
    intervals: list[Interval] = []
    warn: list[str] = []
    for (group, member), evs in sorted(by_member.items()):
        evs.sort(key=lambda e: e[0])  # stable: same-time events keep their file order
        kinds = {e for _, e in evs}
        status = "killed" if "killed" in kinds else "left" if "leave" in kinds else "stayed"
        spans: list[tuple[int, int | None]] = []
        start: int | None = None
        for t_ns, event in evs:
            if event == "join":
                if start is not None:
                    warn.append(f"membership: {member} joined {group} again at {t_ns} "
                                "without leaving")
                    continue
                if spans and spans[-1][1] is not None and spans[-1][1] >= t_ns:
                    start = spans.pop()[0]  # touching intervals: one continuous membership
                else:
                    start = t_ns
            elif event in ("leave", "killed"):
                if start is None:
                    warn.append(f"membership: {member} {event} {group} at {t_ns} "
                                "without being a member")
                    continue
                spans.append((start, t_ns))
                start = None
            else:
                warn.append(f"membership: unknown event {event!r} for {member} in {group}")
        if start is not None:
            spans.append((start, None))
        for i, (s, e) in enumerate(spans):
            nxt = spans[i + 1][0] if i + 1 < len(spans) else None
            intervals.append(Interval(group, member, s, e, nxt, status))
    return intervals, warn


def router_outages(
    manifest: dict[str, Any] | None,
) -> tuple[list[tuple[int, int, list[str]]], list[str]]:
    """The router outages of the run, (down, every member registered again) in ns on the
    run's clock, from the events the driver recorded in the manifest, each with the
    members of the router that was down (the event's ``members``, written for a
    federated run): only the pairs whose sender or receiver is one of them were cut by
    it. An empty list: every pair (one router). With the warnings, as
    :func:`membership_intervals`."""
    warn: list[str] = []
    played = (manifest or {}).get("events")
    config = (manifest or {}).get("scenario_config")
    scheduled = config.get("events") if isinstance(config, dict) else None
    restarts = [e for e in played if isinstance(e, dict)
                and e.get("action") == "restart-router"] if isinstance(played, list) else []
    if not isinstance(played, list) and isinstance(scheduled, list) and any(
            isinstance(e, dict) and e.get("action") == "restart-router" for e in scheduled):
        warn.append("the scenario restarts the router but the manifest does not say when: "
                    "losses across those restarts cannot be told apart from other losses")
    out: list[tuple[int, int, list[str]]] = []
    for e in restarts:
        down = e.get("t_ns")
        if not isinstance(down, int):
            continue
        end = e.get("registered_ns")
        if not isinstance(end, int):
            # Not observed (the watch timed out): the outage lasts until the end of the
            # run, as far as the audit can tell.
            end = 2**62
            warn.append(f"the router restart at {e.get('at')} s: the members were not seen "
                        "registered again; every later loss is counted as across a reconnect")
        members = e.get("members")
        ok = isinstance(members, list) and all(isinstance(m, str) for m in members)
        out.append((down, end, members if ok and members else []))
    return out, warn


def manifest_int(manifest: dict[str, Any] | None, key: str) -> int | None:
    value = (manifest or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def run_end(manifest: dict[str, Any] | None, origin: int,
            ends: list[dict[str, Any]]) -> int:
    """When the run ended, on its clock: t0 + duration + drain from the manifest, else the
    last send or receive time."""
    config = (manifest or {}).get("scenario_config")
    if manifest_int(manifest, "t0_ns") == origin and isinstance(config, dict) and isinstance(
            config.get("duration"), int | float):
        return origin + round((float(config["duration"]) + float(config.get("drain") or 0))
                              * NS_PER_S)
    last = [int(v) for r in ends for v in (r["recv"], r["send"]) if v is not None]
    return max(last, default=origin) + 1
