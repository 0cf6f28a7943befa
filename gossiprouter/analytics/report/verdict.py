"""The verdict on a run: the exit codes of ``gossiprouter analyze``, the scenario's latency
thresholds against the run's latency, and the one-word status with the sentence saying
why. Precedence: an incomplete run, then a corrupted stream, then losses (and, for a
topics run, duplicated or unexpected deliveries), then the thresholds, then OK.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from gossiprouter.analytics.report.formatting import counted, fmt_ms
from gossiprouter.analytics.report.manifest import FRAMING, load_errors, run_status
from gossiprouter.analytics.report.parts import Audit, LatencyStats

__all__ = ["EXIT_FAILED", "EXIT_INCOMPLETE", "EXIT_INPUT", "EXIT_LOSS", "EXIT_OK",
           "EXIT_THRESHOLD", "ThresholdResult", "Verdict", "judge", "thresholds"]


# Exit codes of ``gossiprouter analyze`` (the verdict decides 0, 3, 4 and 5).
EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
"""The analysis itself failed (Spark error, PySpark or Java missing, master unreachable)."""
EXIT_INPUT: Final = 2
"""Bad input: no such run directory, no records, a bad option."""
EXIT_LOSS: Final = 3
"""Deliveries were lost while the sender and the receiver were both registered."""
EXIT_INCOMPLETE: Final = 4
"""The run did not complete (interrupted or failed): its figures are partial."""
EXIT_THRESHOLD: Final = 5
"""A latency threshold of the scenario ([thresholds], as k6's) was exceeded."""


@dataclass(frozen=True)
class Verdict:
    """The one-word status, a sentence saying why, and the exit code of ``analyze``."""

    status: str
    text: str
    exit_code: int

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK


@dataclass(frozen=True)
class ThresholdResult:
    """One ``[thresholds]`` entry of the scenario against the run's latency."""

    key: str
    """``p99_ms`` and the like (gossiprouter.loadtest.scenario.THRESHOLD_KEYS)."""
    limit_ms: float
    observed_ns: int | None
    """None when nothing was delivered (nothing to measure: the threshold fails)."""

    @property
    def label(self) -> str:
        name = self.key.removesuffix("_ms")
        return "p99.9" if name == "p999" else name

    @property
    def ok(self) -> bool:
        return self.observed_ns is not None and self.observed_ns <= self.limit_ms * 1e6


def thresholds(manifest: dict[str, Any] | None,
               latency: LatencyStats | None) -> list[ThresholdResult]:
    """The scenario's latency thresholds (from the manifest) against the run's latency."""
    config = (manifest or {}).get("scenario_config")
    table = config.get("thresholds") if isinstance(config, dict) else None
    if not isinstance(table, dict):
        return []
    lat = latency
    out = []
    for key, limit in table.items():
        if not isinstance(limit, int | float):
            continue
        field_name = key.removesuffix("_ms") + "_ns"
        observed = getattr(lat, field_name, None) if lat is not None else None
        out.append(ThresholdResult(key, float(limit),
                                   observed if isinstance(observed, int) else None))
    return out


def judge(audit: Audit, manifest: dict[str, Any] | None, latency: LatencyStats | None,
          kind: str, allow_loss: bool) -> Verdict:
    """The verdict on a run (a Report's ``verdict``), from its audit, its manifest
    (the load test's status, the peers' errors, the scenario's thresholds), its latency,
    its kind ("route" or "topics") and ``--allow-loss``."""
    # A loss (or an incomplete run) says more than a slow one: thresholds come after.
    v = _audit_verdict(audit, manifest, kind, allow_loss)
    failed = [t for t in thresholds(manifest, latency) if not t.ok]
    if not v.ok or not failed:
        return v
    text = "; ".join(
        f"{t.label} latency {fmt_ms(t.observed_ns)} ms over the threshold of "
        f"{t.limit_ms:g} ms" if t.observed_ns is not None else
        f"no latency to hold to the {t.label} threshold ({t.limit_ms:g} ms): nothing was "
        "delivered" for t in failed)
    return Verdict("THRESHOLD", f"{text}; {v.text}", EXIT_THRESHOLD)


def _audit_verdict(audit: Audit, manifest: dict[str, Any] | None, kind: str,
                   allow_loss: bool) -> Verdict:
    # Precedence: an incomplete run first (its losses may be the interruption's doing, so
    # they prove nothing either way), then an unexplained loss, then OK.
    a = audit
    lost, across = a.lost_registered.count, a.lost_reconnect.count
    status = run_status(manifest)
    if status is not None and status != "ok":
        how = {"interrupted": "was interrupted", "failed": "failed",
               "running": "never finished (the load test was stopped abruptly)"}.get(
                   status, f"ended with status {status!r}")
        text = f"the load test {how}: the figures cover a partial run"
        if lost:
            text += f" ({counted(lost, 'delivery', 'deliveries')} lost while registered)"
        return Verdict("INCOMPLETE", text, EXIT_INCOMPLETE)
    framing = sum(e.count for e in load_errors(manifest) if e.kind == FRAMING)
    if framing:  # a member's stream corrupted: whatever the audit says, the run failed
        return Verdict("CORRUPT", f"{counted(framing, 'frame', 'frames')} from the router did not "
                       "parse at the receiving member (a stream cut into)", EXIT_LOSS)
    if kind == "topics":
        return _topics_verdict(audit, allow_loss)
    reconnect = (f"; {counted(across, 'delivery', 'deliveries')} lost across a reconnect "
                 "(router restart), as expected") if across else ""
    if lost:
        text = (f"{counted(lost, 'delivery', 'deliveries')} lost while the sender and the receiver "
                f"were both registered{reconnect}")
        if allow_loss:
            return Verdict("LOSS ACCEPTED", text + " (accepted with --allow-loss)", EXIT_OK)
        return Verdict("LOSS", text, EXIT_LOSS)
    return Verdict("OK", "no delivery lost while the sender and the receiver were both "
                         f"registered{reconnect}", EXIT_OK)


def _topics_verdict(audit: Audit, allow_loss: bool) -> Verdict:
    # A topic publication reaches every subscriber whose pattern matched, once: a duplicate
    # (an echo through the broker, say) or a delivery to a subscriber that did not match
    # breaks that promise as surely as a loss, so both fail the verdict too.
    a = audit
    wrong = []
    if a.duplicated.count:
        wrong.append(f"{counted(a.duplicated.count, 'delivery', 'deliveries')} duplicated "
                     f"({counted(a.duplicate_copies, 'extra copy', 'extra copies')})")
    if a.unexpected.count:
        wrong.append(f"{counted(a.unexpected.count, 'copy', 'copies')} delivered to subscribers "
                     "whose patterns did not match or outside the scope")
    lost = a.lost.count
    if lost:
        text = (f"{counted(lost, 'delivery', 'deliveries')} lost to subscribers whose patterns "
                "matched at send time")
        text += "".join(f"; {w}" for w in wrong)
        if allow_loss and not wrong:
            return Verdict("LOSS ACCEPTED", text + " (accepted with --allow-loss)", EXIT_OK)
        return Verdict("LOSS", text, EXIT_LOSS)
    if wrong:
        return Verdict("WRONG DELIVERY", "; ".join(wrong), EXIT_LOSS)
    return Verdict("OK", "every publication reached each subscriber whose patterns matched "
                         "at send time, once, and no other", EXIT_OK)
