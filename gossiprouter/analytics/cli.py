"""``gossiprouter analyze``: the command-line face of the load-test analysis.

Exports :func:`analyze_command`, a click command that the main ``gossiprouter`` group
registers. PySpark is imported only when the command runs, so the rest of the CLI starts
fast and works without it.

Exit codes (the verdict decides 0, 3, 4 and 5; see docs/loadtest.md): 0 OK, or LOSS ACCEPTED
with ``--allow-loss``; 1 the analysis failed (Spark error, PySpark or Java missing, master
unreachable); 2 bad input (no such run directory, no records); 3 LOSS: deliveries lost while
the sender and the receiver were both registered; 4 INCOMPLETE: the load test itself was
interrupted or failed, so its figures cover a partial run; 5 THRESHOLD: a latency
threshold of the scenario ([thresholds] p99_ms = 50, ...) was exceeded.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import click

from gossiprouter.analytics.report.baseline import BaselineError, load_baseline
from gossiprouter.analytics.report.verdict import (
    EXIT_FAILED,
    EXIT_INCOMPLETE,
    EXIT_INPUT,
    EXIT_LOSS,
    EXIT_OK,
    EXIT_THRESHOLD,
)
from gossiprouter.core.cli_errors import PREFIX, needs_extra

__all__ = ["EXIT_FAILED", "EXIT_INCOMPLETE", "EXIT_INPUT", "EXIT_LOSS", "EXIT_OK",
           "EXIT_THRESHOLD", "analyze_command", "java_causes"]


def _progress(line: str) -> None:
    # Progress goes to stderr so that stdout carries only the summary.
    click.echo(line, err=True)


def _fail(message: str, code: int) -> SystemExit:
    click.echo(PREFIX + message, err=True)  # the one error format (gossiprouter.core.cli_errors)
    return SystemExit(code)


def java_causes(exc: BaseException, limit: int = 16) -> list[str]:
    """The Java exception chain behind a Py4J error ``exc``, outermost first, each as the
    first line of its ``toString()`` ("Class: message"); empty when ``exc`` carries no Java
    exception or the JVM can no longer be asked (it ended with the analysis)."""
    java = getattr(exc, "java_exception", None)
    if java is None:
        return []
    from py4j.protocol import Py4JError

    chain: list[str] = []
    try:
        while java is not None and len(chain) < limit:
            text = str(java.toString()).strip()
            chain.append(text.splitlines()[0] if text else str(java.getClass().getName()))
            java = java.getCause()
    except Py4JError:  # the gateway closed: what was read so far
        pass
    return chain


def _one_line(exc: BaseException) -> str:
    """A one-line description of a (possibly Java) exception, without the stack trace: the
    outermost error, and the root cause when there is one (Spark wraps the error that
    stopped a job in several layers, e.g. "Boxed Exception", which alone says nothing)."""
    chain = java_causes(exc)
    if chain:
        first = chain[0] if len(chain) == 1 else f"{chain[0]} (root cause: {chain[-1]})"
    else:
        lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
        first = lines[0] if lines else type(exc).__name__
    return first if len(first) <= 400 else first[:397] + "..."


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _see(log_path: Path, before: int) -> str:
    """Where Spark's log is, when this run wrote to it (a failure before Spark started
    wrote nothing there)."""
    return f" (Spark log: {log_path})" if _size(log_path) > before else ""


@click.command("analyze")
@click.argument("run_dir", metavar="RUN_DIR")
@click.option("--master", metavar="URL", default=None,
              help="Spark master URL, e.g. spark://host:7077 (default: embedded local[*]).")
@click.option("--out", "out_dir", metavar="REPORT_DIR", default=None,
              help="Where report.json and report.html go (default: RUN_DIR/report).")
@click.option("--settle", type=click.FloatRange(min=0), default=1.0, show_default=True,
              metavar="SECONDS",
              help="Settle window: receivers must be members for [t_send, t_send+SECONDS].")
@click.option("--sample", type=click.IntRange(min=0), default=20, show_default=True,
              help="Examples kept per kind of anomaly.")
@click.option("--conf", "conf", multiple=True, metavar="KEY=VALUE",
              help="Extra Spark configuration, repeatable (e.g. spark.executor.memory=4g; "
                   "on a real cluster spark.driver.host=ADDRESS the executors can reach).")
@click.option("--baseline", "baseline_dir", metavar="OTHER_RUN", default=None,
              help="An earlier analysed run (its directory, or its report directory or "
                   "report.json) to compare with: both runs' key figures side by side.")
@click.option("--allow-loss", is_flag=True,
              help="Exit 0 (verdict LOSS ACCEPTED) even if deliveries were lost while the "
                   "sender and the receiver were both registered.")
def analyze_command(
    run_dir: str,
    master: str | None,
    out_dir: str | None,
    settle: float,
    sample: int,
    conf: tuple[str, ...],
    allow_loss: bool,
    baseline_dir: str | None,
) -> None:
    """Audit the load-test run in RUN_DIR (a path or a Hadoop URI) with Apache Spark.

    Checks every message against its expected receivers (lost, duplicated, out of order),
    computes latency percentiles and throughput, writes report.json and report.html, and
    prints a summary.
    """
    settings: dict[str, str] = {}
    for item in conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise _fail(f"--conf expects KEY=VALUE, got {item!r}", EXIT_INPUT)
        settings[key.strip()] = value
    out = out_dir or run_dir.rstrip("/") + "/report"
    baseline = None
    if baseline_dir is not None:
        # Read before Spark starts: a wrong path fails in a second, not after the audit.
        try:
            baseline = load_baseline(baseline_dir)
        except BaselineError as e:
            raise _fail(str(e), EXIT_INPUT) from None

    try:
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException

        from gossiprouter.analytics.audit import (
            AuditInputError,
            SparkStartError,
            analyze,
            check_run_dir,
            local_path,
        )
        from gossiprouter.analytics.report.summary import format_summary
        from gossiprouter.analytics.session import run_kind
        from gossiprouter.analytics.spark_io import check_java
        from gossiprouter.analytics.topics_audit import analyze_topics, check_topics_run_dir
    except ImportError:
        raise _fail(needs_extra("the analysis", "PySpark", "loadtest"), EXIT_FAILED) from None

    # A topics run (gossiprouter loadtest-topics --out) says so in its manifest.
    topics = run_kind(run_dir) is not None
    try:
        (check_topics_run_dir if topics else check_run_dir)(run_dir)
    except AuditInputError as e:
        raise _fail(str(e), EXIT_INPUT) from None

    try:
        check_java()  # before Spark starts: PySpark would say "Java gateway process exited"
    except SparkStartError as e:
        raise _fail(str(e), EXIT_FAILED) from None

    # Spark's own log lines would bury the summary: they go to a file next to the report.
    local_out = local_path(out)
    if local_out is not None:
        try:
            local_out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _fail(f"cannot create report directory {out}: {e}", EXIT_INPUT) from None
        log_path = local_out / "spark.log"
    else:
        log_path = Path(tempfile.gettempdir()) / "gossiprouter-analyze-spark.log"

    logged = _size(log_path)
    try:
        if topics:
            report = analyze_topics(run_dir, out, master=master, sample=sample,
                                    conf=settings, spark_log=log_path, progress=_progress,
                                    allow_loss=allow_loss, baseline=baseline, exiting=True)
        else:
            report = analyze(run_dir, out, master=master, settle_s=settle, sample=sample,
                             conf=settings, spark_log=log_path, progress=_progress,
                             allow_loss=allow_loss, baseline=baseline, exiting=True)
    except AuditInputError as e:
        raise _fail(str(e), EXIT_INPUT) from None
    except SparkStartError as e:
        raise _fail(f"{e}{_see(log_path, logged)}", EXIT_FAILED) from None
    except (PySparkException, Py4JError, OSError) as e:
        raise _fail(f"analysis failed: {_one_line(e)}{_see(log_path, logged)}",
                    EXIT_FAILED) from None

    click.echo(format_summary(report))
    click.echo(f"report: {out.rstrip('/')}/report.html")
    verdict = report.verdict
    if verdict.exit_code == EXIT_LOSS:
        # Offer --allow-loss only when it would accept the run (it accepts losses, not a
        # topics run's duplicated or unexpected deliveries).
        hint = ("; --allow-loss to accept"
                if dataclasses.replace(report, allow_loss=True).verdict.ok else "")
        raise _fail(f"{verdict.text} (see the report{hint})", EXIT_LOSS)
    if verdict.exit_code in (EXIT_INCOMPLETE, EXIT_THRESHOLD):
        raise _fail(verdict.text, verdict.exit_code)
    assert verdict.exit_code == EXIT_OK
