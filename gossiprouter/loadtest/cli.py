"""``gossiprouter loadtest``: run a scripted-peer load test and write its run directory.

Exports :func:`loadtest_command`, a click command that the main ``gossiprouter`` group
registers. Exit status: 0 the run completed (what was delivered is for ``gossiprouter
analyze`` to say); 1 the run failed (a peer or the router died, a timeout); 2 bad input (the
scenario, the options, a run directory in use); 130 interrupted (Ctrl-C). Every failure is
one line on stderr, ``gossiprouter: error: ...``, never a traceback; the child processes are
stopped in every case.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Final, NoReturn

import click
import trio

from gossiprouter.core.cli_errors import fail, needs_extra
from gossiprouter.loadtest.scenario import Scenario
from gossiprouter.loadtest.scenario_checks import ScenarioError
from gossiprouter.loadtest.scenario_file import load_scenario

if TYPE_CHECKING:
    from gossiprouter.loadtest.driver import RunResult
    from gossiprouter.loadtest.progress import Progress

__all__ = ["EXIT_FAILED", "EXIT_INPUT", "EXIT_INTERRUPTED", "loadtest_command"]

EXIT_FAILED: Final = 1
EXIT_INPUT: Final = 2
EXIT_INTERRUPTED: Final = 130


def _fail(message: str, code: int) -> NoReturn:
    fail(message, code)  # the one error format (gossiprouter.core.cli_errors)


@click.command("loadtest")
@click.argument("scenario_file", metavar="SCENARIO",
                type=click.Path(dir_okay=False, path_type=Path))
@click.option("--router", "router", metavar="HOST:PORT", default=None,
              help="Use the router already running at HOST:PORT (on 127.0.0.1).")
@click.option("--spawn-router", is_flag=True,
              help="Start a router on a free port of 127.0.0.1 for the run (needed for "
                   "restart-router events).")
@click.option("--out", "run_dir", metavar="RUN_DIR", default=None,
              type=click.Path(file_okay=False, path_type=Path),
              help="Run directory to create (new or empty): records, membership, manifest. "
                   "Required, but for a topics scenario (then: records for `gossiprouter "
                   "analyze`).")
@click.option("--progress/--no-progress", "live", default=None,
              help="Live progress table [default: when stderr is a terminal; plain lines "
                   "otherwise].")
def loadtest_command(scenario_file: Path, router: str | None, spawn_router: bool,
                     run_dir: Path | None, live: bool | None) -> None:
    """Run the load-test SCENARIO (a TOML file) and write the run to RUN_DIR.

    Starts the scenario's peer processes (each runs many members, by default one
    RouterStub per member), joins the members, sends for the scenario's duration while
    playing its timed events (leave, join, kill a process, restart the router), drains, and
    writes records/*.parquet, membership.parquet and manifest.json to RUN_DIR. Then audit
    the run with `gossiprouter analyze RUN_DIR`. The scenario format is described in
    docs/loadtest.md; examples are in scripts/scenarios/.

    A topics scenario (kind = "topics", docs/topics.md) starts its own routers, federated
    through a mosquitto, and audits the run itself; --out RUN_DIR is optional there.

    \b
    Examples:
      gossiprouter loadtest scripts/scenarios/small.toml --spawn-router --out runs/small-1
      gossiprouter loadtest my.toml --router 127.0.0.1:12001 --out runs/my-1 --no-progress
      gossiprouter loadtest scripts/scenarios/topics.toml
    """
    from gossiprouter.loadtest.topics import run_topics_command
    from gossiprouter.loadtest.topics_scenario import is_topics_scenario

    if is_topics_scenario(scenario_file):
        if router is not None:
            _fail(f"{scenario_file.name} is a topics scenario, which starts its own routers: "
                  "drop --router", EXIT_INPUT)
        run_topics_command(scenario_file, run_dir)
        return
    if (router is None) == (not spawn_router):
        _fail("give either --router HOST:PORT or --spawn-router", EXIT_INPUT)
    if run_dir is None:
        _fail("give --out RUN_DIR: the directory the run is written to", EXIT_INPUT)
    try:
        scenario = load_scenario(scenario_file)
    except ScenarioError as e:
        _fail(str(e), EXIT_INPUT)
    try:
        # Imported here: pyarrow and rich are the "loadtest" extra, and the rest of the
        # command line (serve, ...) must start fast and work without them.
        from rich.console import Console

        from gossiprouter.loadtest.driver import first_error
        from gossiprouter.loadtest.errors import RunInputError
        from gossiprouter.loadtest.progress import Progress
    except ImportError:
        _fail(needs_extra("the load test", "pyarrow and rich", "loadtest"), EXIT_FAILED)
    progress = Progress(Console(stderr=True), live=live)
    try:
        result = trio.run(_run, scenario, run_dir, router, spawn_router, progress,
                          str(scenario_file))
    except RunInputError as e:
        _fail(str(e), EXIT_INPUT)
    except KeyboardInterrupt:
        _fail("interrupted; every child process was stopped "
              f"(partial run in {run_dir})", EXIT_INTERRUPTED)
    except BaseException as e:
        err = first_error(e)
        if isinstance(e, BaseExceptionGroup) and e.subgroup(KeyboardInterrupt) is not None:
            _fail("interrupted; every child process was stopped "
                  f"(partial run in {run_dir})", EXIT_INTERRUPTED)
        if err is None:
            raise
        _fail(str(err), EXIT_INPUT if isinstance(err, RunInputError) else EXIT_FAILED)
    click.echo(result.summary(scenario))


async def _run(scenario: Scenario, run_dir: Path, router: str | None, spawn: bool,
               progress: Progress, scenario_file: str) -> RunResult:
    from gossiprouter.loadtest.driver import run_loadtest

    return await run_loadtest(scenario, run_dir, router=router, spawn_router=spawn,
                              progress=progress, scenario_file=scenario_file)

