"""``analyze --baseline``: an earlier analysed run's key figures (:func:`load_baseline`,
read from its report.json) beside this run's, with the change and a noise hint
(:func:`comparison_rows`), each run's environment first (host load, cores, fast path), for
the summary and report.html.

The noise hint: two runs of the same code on this kind of machine differ by up to about
±20 % in latency and throughput (docs/performance-history.md), and by much more when the
host is busy (more runnable threads than cores: the router waits for a core). So a change
of a latency or a rate within :data:`NOISE_BAND` (:data:`BUSY_NOISE_BAND` when either
host was busy) is flagged "within noise", not read as a regression or a gain; runs on a
different number of cores or with the fast path on in one and off in the other are
flagged "not comparable". Counts (lost, duplicated, ...) are exact: no hint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gossiprouter.analytics.report.formatting import fmt_ms
from gossiprouter.analytics.report.model import (
    ENVIRONMENT_FIGURES,
    KEY_FIGURES,
    Report,
    key_figures,
)

__all__ = ["BUSY_NOISE_BAND", "COMPARISON_HEADERS", "NOISE_BAND", "BaselineError", "Noise",
           "baseline_name", "comparison_rows", "load_baseline", "noise", "noise_text"]

NOISE_BAND: Final = 0.20
"""The run-to-run spread of a latency or a rate between two runs of the same code on quiet
hosts (mean load at most the cores): a change within it is noise."""
BUSY_NOISE_BAND: Final = 0.50
"""The same when either host was busy (mean one-minute load above its cores)."""
COMPARISON_HEADERS: Final = ("key figure", "baseline", "this run", "change", "noise")


class BaselineError(ValueError):
    """``--baseline`` names no usable report; the message is one line saying why."""


def load_baseline(path: str) -> dict[str, Any]:
    """The key figures of an earlier analysed run, for ``analyze --baseline PATH``: PATH is
    its run directory (its report in PATH/report), a report directory or a report.json."""
    p = Path(path)
    candidates = [p] if p.suffix == ".json" else [p / "report" / "report.json",
                                                   p / "report.json"]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        if not p.exists():
            raise BaselineError(f"--baseline {path}: no such run directory or report")
        raise BaselineError(f"--baseline {path}: no report.json there or in {path}/report "
                            f"(run `gossiprouter analyze {path}` first)")
    try:
        data = json.loads(found.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise BaselineError(f"--baseline {path}: cannot read {found}: {e}") from None
    if not isinstance(data, dict) or not str(data.get("format", "")).startswith(
            "gossiprouter-loadtest-report/"):
        raise BaselineError(f"--baseline {path}: {found} is not a report of gossiprouter "
                            "analyze")
    figures = data.get("key_figures")
    if not isinstance(figures, dict):
        raise BaselineError(f"--baseline {path}: {found} was written by an older version "
                            f"without key figures (run `gossiprouter analyze {path}` again)")
    runs = data.get("runs")
    return {"path": str(found), "runs": runs if isinstance(runs, list) else [],
            "kind": data.get("kind"), "key_figures": figures}


def _show_figure(value: Any, how: str) -> str:
    if value is None:
        return "-"
    if how == "ms" and isinstance(value, int | float):
        return fmt_ms(value * 1e6)
    if how == "rate" and isinstance(value, int | float):
        return f"{value:,.0f}"
    if how == "int" and isinstance(value, int | float):
        return f"{value:,.0f}"
    if how == "load" and isinstance(value, int | float):
        return f"{value:.2f}"
    return str(value)


def _change(old: Any, new: Any, how: str) -> str:
    """``+1.20 ms (+24.0 %)``, ``-50/s (-2.1 %)``, ``+3``, ``same``, ``changed``."""
    if how == "text" or not isinstance(old, int | float) or not isinstance(new, int | float):
        if old is None or new is None:
            return "-"
        return "same" if old == new else "changed"
    delta = new - old
    if delta == 0:
        return "same"
    if how == "ms":
        text = f"{'+' if delta > 0 else '-'}{fmt_ms(abs(delta) * 1e6)} ms"
    elif how == "rate":
        text = f"{delta:+,.0f}/s"
    elif how == "load":
        return f"{delta:+.2f}"
    else:
        text = f"{delta:+,.0f}"
    return text + (f" ({delta / old * 100:+,.1f} %)" if old else "")


@dataclass(frozen=True)
class Noise:
    """How far two runs' latencies and rates may differ by chance: ``band`` (a share:
    0.2 is ±20 %), or None when the runs are not comparable at all; ``why`` says so in
    words."""

    band: float | None
    why: str

    def hint(self, old: Any, new: Any, how: str) -> str:
        """The noise column of one figure: within or beyond the band (and which way)."""
        if how not in ("ms", "rate") or not isinstance(old, int | float) \
                or not isinstance(new, int | float):
            return ""
        if self.band is None:
            return "not comparable"
        if old == new:
            return "same"
        rel = abs(new - old) / old if old else float("inf")
        band = f"±{self.band * 100:.0f} %"
        if rel <= self.band:
            return f"within noise ({band})"
        worse = (new > old) == (how == "ms")
        return f"beyond noise ({band}): {'worse' if worse else 'better'}"


def _busy(figures: dict[str, Any]) -> str | None:
    load, cores = figures.get("load_mean"), figures.get("cores")
    if isinstance(load, int | float) and isinstance(cores, int) and load > cores:
        return f"load {load:.2f} on {cores} cores"
    return None


def noise(old: dict[str, Any], new: dict[str, Any]) -> Noise:
    """The noise band between a baseline's key figures and this run's."""
    for key, what in (("cores", "cores"), ("fast_path", "fast path")):
        a, b = old.get(key), new.get(key)
        if a is not None and b is not None and a != b:
            return Noise(None, f"not comparable: {what} {a} in the baseline, {b} in this run")
    busy = [f"{who} host was busy ({load})" for who, load in
            (("the baseline's", _busy(old)), ("this run's", _busy(new))) if load]
    if busy:
        return Noise(BUSY_NOISE_BAND, f"±{BUSY_NOISE_BAND * 100:.0f} %: "
                     + " and ".join(busy))
    unknown = [who for who, f in (("the baseline", old), ("this run", new))
               if f.get("load_mean") is None]
    if unknown:
        return Noise(NOISE_BAND, f"±{NOISE_BAND * 100:.0f} % (host load not known for "
                     f"{' and '.join(unknown)}: assumed quiet)")
    return Noise(NOISE_BAND, f"±{NOISE_BAND * 100:.0f} %: both hosts quiet (mean load at "
                 "most their cores)")


def _environment_hint(key: str, old: dict[str, Any], new: dict[str, Any]) -> str:
    if key == "load_mean":
        return "; ".join(f"{who} busy" for who, f in (("baseline", old), ("this run", new))
                         if _busy(f))
    a, b = old.get(key), new.get(key)
    return "not comparable" if a is not None and b is not None and a != b else ""


def comparison_rows(report: Report) -> list[list[str]]:
    """[figure, baseline, this run, change, noise] (COMPARISON_HEADERS): each run's
    environment first, then each key figure either run has."""
    if report.baseline is None:
        return []
    old_figures = report.baseline.get("key_figures") or {}
    new_figures = key_figures(report)
    band = noise(old_figures, new_figures)
    rows = []
    for key, label, how in ENVIRONMENT_FIGURES:
        old, new = old_figures.get(key), new_figures.get(key)
        # An older baseline has no environment: shown as "-", never left out, so the
        # reader sees that it is unknown.
        rows.append([label, _show_figure(old, how), _show_figure(new, how),
                     _change(old, new, "text" if how == "int" else how),
                     _environment_hint(key, old_figures, new_figures)])
    for key, label, how in KEY_FIGURES:
        old, new = old_figures.get(key), new_figures.get(key)
        if old is None and new is None:
            continue
        rows.append([label, _show_figure(old, how), _show_figure(new, how),
                     _change(old, new, how), band.hint(old, new, how)])
    return rows


def noise_text(report: Report) -> str:
    """One sentence on the noise band of the comparison (empty without a baseline)."""
    if report.baseline is None:
        return ""
    band = noise(report.baseline.get("key_figures") or {}, key_figures(report))
    if band.band is None:
        return (f"The runs are {band.why}: their latencies and rates differ by more than "
                "the code.")
    return (f"Noise band {band.why}; a latency or rate that changed by less is within "
            "noise, not a regression.")


def baseline_name(report: Report) -> str:
    b = report.baseline or {}
    runs = ", ".join(str(r) for r in b.get("runs") or []) or "an earlier run"
    other = b.get("kind")
    # Runs of two kinds can be set side by side, but their figures measure different paths.
    kinds = (f"; a {other} run against this {report.kind} run"
             if isinstance(other, str) and other != report.kind else "")
    return f"{runs} ({b.get('path')}{kinds})"
