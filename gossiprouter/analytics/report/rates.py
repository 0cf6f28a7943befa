"""The run's rates as a k6 or Gatling user reads them: the send rate the scenario asked for
against the one achieved, in msg/s (:func:`send_rates`), and the error rate
(:func:`error_rates`): the share of send attempts that failed or that the router refused,
beside the share of expected deliveries lost. For the terminal summary and report.html."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gossiprouter.analytics.report.formatting import fmt_int
from gossiprouter.analytics.report.manifest import load_errors
from gossiprouter.analytics.report.model import Report, throughput_summary

__all__ = ["ErrorRates", "SendRates", "error_rates", "percent", "send_rates"]


def percent(n: int, of: int) -> str:
    """``0.25 %``: two decimals, as an error rate is small; ``0 %`` of nothing."""
    return f"{100 * n / of:.2f} %" if of else "0 %"


@dataclass(frozen=True)
class SendRates:
    """Messages per second: ``target`` is what the scenario asks for (each sending member's
    ``rate``, summed; None when a group sends as fast as it can, or without a scenario),
    ``achieved`` what was sent per second over the sending window (from the send records;
    None without a duration), over ``window_s`` seconds. ``senders`` members send."""

    target: float | None
    achieved: float | None
    window_s: float
    senders: int
    unpaced: bool
    """A group sends at rate "max": there is no target to hold the run to."""

    @property
    def share(self) -> float | None:
        if self.target is None or self.achieved is None or self.target <= 0:
            return None
        return self.achieved / self.target

    def text(self) -> str:
        """``target 400 msg/s (8 sending members), achieved 392 msg/s (98.0 %) over the
        10 s sending window``."""
        if self.target is not None:
            head = f"target {self.target:,.0f} msg/s ({fmt_int(self.senders)} sending members)"
        elif self.unpaced:
            head = "target: as fast as possible (rate max)"
        else:
            head = "target unknown (no scenario in the manifest)"
        if self.achieved is None:
            return head + "; achieved unknown (no sending window: the manifest gives no duration)"
        share = self.share
        return (head + f", achieved {self.achieved:,.0f} msg/s"
                + (f" ({share * 100:.1f} %)" if share is not None else "")
                + f" over the {self.window_s:g} s sending window")


def _sending_members(config: dict[str, Any], manifest: dict[str, Any]) -> dict[str, int]:
    """Sending members by group: the group's members less those of receive-only processes."""
    groups = {str(g.get("name")): int(g.get("members") or 0)
              for g in config.get("groups") or () if isinstance(g, dict)}
    peers = config.get("peers") if isinstance(config.get("peers"), dict) else {}
    assert isinstance(peers, dict)
    quiet = set(peers.get("receive_only") or ())
    processes = manifest.get("processes")
    if quiet and isinstance(processes, list):
        for p in processes:
            if isinstance(p, dict) and p.get("proc") in quiet:
                for member in p.get("members") or ():
                    group = str(member).rsplit("-", 1)[0]
                    if group in groups:
                        groups[group] -= 1
    return groups


def send_rates(report: Report) -> SendRates | None:
    """Target against achieved msg/s (None for a report without a manifest)."""
    m = report.manifest
    if not m:
        return None
    config = m.get("scenario_config") if isinstance(m.get("scenario_config"), dict) else {}
    assert isinstance(config, dict)
    tp = throughput_summary(report)
    senders = _sending_members(config, m)
    rates = {str(g.get("name")): g.get("rate") for g in config.get("groups") or ()
             if isinstance(g, dict)}
    unpaced = any(r == "max" for r in rates.values())
    target: float | None = None
    if not unpaced:
        paced = [(float(rate), n) for g, n in senders.items()
                 if isinstance(rate := rates.get(g), int | float)]
        target = sum(r * n for r, n in paced) if paced else None
    if report.kind == "topics":  # publishers, not members: the topics config says how many
        pubs, rate, routers = (config.get(k) for k in ("publishers", "rate", "routers"))
        if isinstance(pubs, int) and isinstance(rate, int | float) \
                and isinstance(routers, int):
            senders = {"": pubs * routers}
            target = float(pubs * routers * rate)
    return SendRates(target, tp.steady_sends, tp.steady_s, sum(senders.values()), unpaced)


@dataclass(frozen=True)
class ErrorRates:
    """``errors`` of ``attempts`` sends failed (no router within the stub's send timeout)
    or came back as a router error (``unknown_destination``, say); ``lost`` of
    ``expected`` deliveries were lost (of every kind; ``lost_reconnect`` of them across a
    reconnect)."""

    errors: int
    attempts: int
    lost: int
    expected: int
    lost_reconnect: int

    @property
    def error_share(self) -> str:
        return percent(self.errors, self.attempts)

    @property
    def lost_share(self) -> str:
        return percent(self.lost, self.expected)

    def text(self) -> str:
        """``0.25 % of send attempts (10 of 4,010: failed sends and router errors); 0.05 %
        of expected deliveries lost (2 of 4,000)``."""
        reconnect = (f", {fmt_int(self.lost_reconnect)} of them across a reconnect"
                     if self.lost_reconnect else "")
        return (f"{self.error_share} of send attempts "
                f"({fmt_int(self.errors)} of {fmt_int(self.attempts)}: failed sends and "
                f"router errors); {self.lost_share} of expected "
                f"deliveries lost ({fmt_int(self.lost)} of {fmt_int(self.expected)}"
                f"{reconnect})")


def error_rates(report: Report) -> ErrorRates:
    errors = load_errors(report.manifest)
    failed = sum(e.count for e in errors if e.kind == "send failed")
    refused = sum(e.count for e in errors if e.kind.startswith("router error: "))
    a = report.audit
    return ErrorRates(failed + refused, report.counts.messages + failed, a.lost.count,
                      a.expected, a.lost_reconnect.count)
