"""The load test's live progress display: a rich table on a terminal, plain lines otherwise.

The driver (:mod:`gossiprouter.loadtest.driver`) hands :meth:`Progress.run` a snapshot function;
each peer process's view (:class:`PeerView`) comes from its ``stats`` lines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from gossiprouter.loadtest.scenario import Scenario

__all__ = ["PeerView", "Progress", "rates_line", "target_rate", "total_view"]


@dataclass
class PeerView:
    """What the progress display shows of one peer."""

    proc: int
    members: int
    joined: int
    state: str
    sent: int
    received: int
    errors: int
    dropped: int
    send_rate: float
    recv_rate: float


class Progress:
    """Live progress on a console: a rich table when ``live``, else plain lines.

    Event lines are printed above the table as they happen; the table shows per-process
    counters and rates, refreshed a few times a second.
    """

    def __init__(self, console: Console | None = None, *, live: bool | None = None,
                 plain_every: float = 5.0) -> None:
        self.console = console or Console(stderr=True)
        self.live_mode = self.console.is_terminal if live is None else live
        self.plain_every = plain_every
        self._live: Live | None = None
        self._t0_ns: int | None = None

    @classmethod
    def silent(cls) -> Progress:
        """A display that shows nothing (a run from Python without a progress display)."""
        return cls(Console(quiet=True), live=False)

    def elapsed(self) -> float:
        return 0.0 if self._t0_ns is None else (time.monotonic_ns() - self._t0_ns) / 1e9

    def set_t0(self, t0_ns: int) -> None:
        self._t0_ns = t0_ns

    def log(self, text: str) -> None:
        stamp = f"{self.elapsed():7.2f} s  " if self._t0_ns is not None else "           "
        # Off a terminal (a log file, a CI job) a line stays one line, however long: rich
        # would wrap it at 80 columns mid-sentence.
        self.console.print(Text(stamp + text), highlight=False,
                           soft_wrap=not self.console.is_terminal)

    async def run(self, snapshot: Callable[[], tuple[str, list[PeerView]]]) -> None:
        """Refresh the display until cancelled."""
        if not self.live_mode:
            while True:
                await trio.sleep(self.plain_every)
                _, views = snapshot()
                self.log(_plain_line(views))
        with Live(console=self.console, auto_refresh=False, transient=False) as live:
            self._live = live
            try:
                while True:
                    live.update(_render(*snapshot()), refresh=True)
                    await trio.sleep(0.25)
            finally:
                live.update(_render(*snapshot()), refresh=True)
                self._live = None


def _plain_line(views: list[PeerView]) -> str:
    t = total_view(views)
    return (f"sent {t.sent:,} ({t.send_rate:,.0f}/s), delivered {t.received:,} "
            f"({t.recv_rate:,.0f}/s), errors {t.errors:,}, dropped {t.dropped:,}")


def total_view(views: list[PeerView]) -> PeerView:
    """The sum of ``views`` (the total row; the counters of a run's result)."""
    return PeerView(-1, sum(v.members for v in views), sum(v.joined for v in views), "",
                    sum(v.sent for v in views), sum(v.received for v in views),
                    sum(v.errors for v in views), sum(v.dropped for v in views),
                    sum(v.send_rate for v in views), sum(v.recv_rate for v in views))


def _render(title: str, views: list[PeerView]) -> Group:
    table = Table(title=None, expand=False, show_edge=False, pad_edge=False)
    for name, justify in (("process", "left"), ("members", "right"), ("state", "left"),
                          ("sent", "right"), ("delivered", "right"), ("sent/s", "right"),
                          ("delivered/s", "right"), ("errors", "right"), ("dropped", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]

    def row(v: PeerView, label: str) -> list[str]:
        return [label, f"{v.joined}/{v.members}", v.state, f"{v.sent:,}", f"{v.received:,}",
                f"{v.send_rate:,.0f}", f"{v.recv_rate:,.0f}",
                f"{v.errors:,}", f"{v.dropped:,}"]

    for v in views:
        table.add_row(*row(v, f"p{v.proc}"),
                      style="red" if v.state in ("failed",) else
                      "dim" if v.state in ("killed", "done") else None)
    if len(views) > 1:
        table.add_section()
        table.add_row(*row(total_view(views), "total"), style="bold")
    return Group(Text(title, style="bold"), table)


def target_rate(scenario: Scenario) -> float | None:
    """The msg/s the scenario asks of its senders: each sending member's ``rate``, summed
    (members of ``receive_only`` processes do not send); None when a group sends at rate
    "max" (no target)."""
    total = 0.0
    for m in scenario.members:
        if m.proc in scenario.receive_only:
            continue
        rate = scenario.group(m.group).send.rate
        if rate is None:
            return None
        total += rate
    return total


def rates_line(scenario: Scenario, sent: int, errors: int, send_errors: int) -> str:
    """The run's rates for the end-of-run summary, as k6 gives them: ``rate: target 400
    msg/s, achieved 398 msg/s (99.5 %) over the 10 s of sending; error rate 0.25 % (10 of
    4,010 send attempts failed or came back as a router error)``. Achieved is the
    messages sent over the sending window (``duration``): members that joined late or
    left early send for less of it."""
    target = target_rate(scenario)
    achieved = sent / scenario.duration
    head = (f"rate: target {target:,.0f} msg/s, achieved {achieved:,.0f} msg/s"
            + (f" ({achieved / target * 100:.1f} %)" if target else "")
            if target is not None else
            f"rate: as fast as possible (rate max), achieved {achieved:,.0f} msg/s")
    attempts = sent + send_errors
    share = f"{errors / attempts * 100:.2f} %" if attempts else "0 %"
    return (f"{head} over the {scenario.duration:g} s of sending; error rate {share} "
            f"({errors:,} of {attempts:,} send attempts failed or came back as a router "
            "error)")
