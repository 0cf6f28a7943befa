"""``analyze --baseline``: an earlier analysed run's key figures (:func:`load_baseline`,
read from its report.json) beside this run's, with the change (:func:`comparison_rows`),
for the summary and report.html."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gossiprouter.analytics.report.formatting import fmt_ms
from gossiprouter.analytics.report.model import KEY_FIGURES, Report, key_figures

__all__ = ["BaselineError", "baseline_name", "comparison_rows", "load_baseline"]


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
    else:
        text = f"{delta:+,.0f}"
    return text + (f" ({delta / old * 100:+,.1f} %)" if old else "")


def comparison_rows(report: Report) -> list[list[str]]:
    """[figure, baseline, this run, change] for each key figure either run has."""
    if report.baseline is None:
        return []
    old_figures = report.baseline.get("key_figures") or {}
    new_figures = key_figures(report)
    rows = []
    for key, label, how in KEY_FIGURES:
        old, new = old_figures.get(key), new_figures.get(key)
        if old is None and new is None:
            continue
        rows.append([label, _show_figure(old, how), _show_figure(new, how),
                     _change(old, new, how)])
    return rows


def baseline_name(report: Report) -> str:
    b = report.baseline or {}
    runs = ", ".join(str(r) for r in b.get("runs") or []) or "an earlier run"
    other = b.get("kind")
    # Runs of two kinds can be set side by side, but their figures measure different paths.
    kinds = (f"; a {other} run against this {report.kind} run"
             if isinstance(other, str) and other != report.kind else "")
    return f"{runs} ({b.get('path')}{kinds})"
