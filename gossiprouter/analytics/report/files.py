"""Writing the report: report.json (the :class:`~.model.Report` as JSON, strict: no NaN)
and report.html, to local files or through a writer the Spark job passes (Hadoop's
FileSystem API for hdfs://, s3a://, ...)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gossiprouter.analytics.report.html_page import render_html
from gossiprouter.analytics.report.model import Report

__all__ = ["write_report"]


def _finite(o: Any) -> Any:
    # Strict JSON has no NaN/inf; report such values (e.g. a mean over nothing) as null.
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_finite(v) for v in o]
    return o


def _write_local(path: str, data: bytes) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def write_report(
    report: Report,
    out_dir: str,
    write: Callable[[str, bytes], None] | None = None,
    plots: dict[str, str] | None = None,
) -> list[str]:
    """Write report.json and report.html into ``out_dir``; returns the paths written.

    ``write(path, data)`` writes one file; the default writes local files. The Spark job
    passes a Hadoop FileSystem writer for non-local URIs (hdfs://, s3a://, ...). ``plots``:
    the report's plots, if already drawn (:class:`~.plots.EarlyPlots`).
    """
    writer = write or _write_local
    base = out_dir.rstrip("/")
    json_path, html_path = f"{base}/report.json", f"{base}/report.html"
    data = json.dumps(_finite(report.to_dict()), indent=2, allow_nan=False)
    writer(json_path, (data + "\n").encode())
    writer(html_path, render_html(report, plots).encode())
    return [json_path, html_path]
