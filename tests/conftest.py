"""Shared fixtures: an in-process router on a free 127.0.0.1 port, a local Spark, and a
short federated topics scenario."""

from __future__ import annotations

import json
import shutil
from collections.abc import Awaitable, Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from gossiprouter.core.config import Config
from gossiprouter.loadtest.processes import MOSQUITTO
from gossiprouter.ops.runtime import Operations
from gossiprouter.server.listener import Server

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

RouterFactory = Callable[..., Awaitable[Server]]


def pytest_addoption(parser: pytest.Parser) -> None:
    # Both read paths are tested: CI runs the socket suites with each (docs/performance.md).
    parser.addoption("--dispatcher", choices=("on", "off"), default=None,
                     help="in-process routers read plain-TCP connections from the dispatcher "
                          "task (on) or one reader task per connection (off); default: the "
                          "config default")
    parser.addoption("--read-path-pass", action="store_true",
                     help="scripts/test's second pass (on the pure-Python path): deselect the "
                          "tests that cannot depend on the read path (see one_pass())")


# Modules whose tests never start a router (codecs, tables, sans-IO client parts, docs and
# packaging): what they check cannot depend on the read path.
SANS_IO_MODULES = frozenset({
    "test_native_codec", "test_jgroups2_codec", "test_jgroups5_codec", "test_native_scan",
    "test_jgroups_scan", "test_jgroups_common", "test_routing_rules", "test_native_state",
    "test_client_merge", "test_client_registrar", "test_dependencies", "test_docs",
    "test_hooks", "test_packaging", "test_federation", "test_federation_hostile",
    "test_federation_handover",
})

# Modules that start no in-process router whose read path they check: the HTML report (read
# from files), the set-up scripts, the docs' snippets (their routers are the CLI's, checked
# for what the docs say) and the benchmarks' harnesses.
NO_READ_PATH_MODULES = frozenset({
    "test_report", "test_report_reading", "test_scripts", "test_doc_snippets",
    "test_bench_federation", "test_bench_stub_loops", "test_broker_link",
    "test_broker_link_inbound",
})

# Fixtures that start a router: a test using fake_router (a scripted peer, tests/stubkit.py)
# and none of these checks only the stub.
ROUTER_FIXTURES = frozenset({"router", "start_router"})


def one_pass(item: pytest.Item) -> bool:
    """Whether scripts/test runs ``item`` in its first pass only: marked ``one_pass`` (it runs
    scripts, or sets the fast path itself), ``spark`` (the audit reads records, whichever path
    relayed them), in a sans-IO module or one that starts no router (NO_READ_PATH_MODULES), a
    stub test against a scripted peer only, or a stub test's run on asyncio (its trio run is the
    one that meets both read paths: the stub is the same code on either loop)."""
    module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    callspec = getattr(item, "callspec", None)
    loop = callspec.params.get("anyio_backend") if callspec is not None else None
    fixtures = set(getattr(item, "fixturenames", ()))
    return (item.get_closest_marker("one_pass") is not None
            or item.get_closest_marker("spark") is not None
            or module in SANS_IO_MODULES or module in NO_READ_PATH_MODULES
            or ("fake_router" in fixtures and not ROUTER_FIXTURES & fixtures)
            or loop not in (None, "trio"))


@pytest.hookimpl(trylast=True)  # after pytest-trio's trio mode, see below
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Tests marked ``anyio`` (the stub's, on asyncio and trio: tests/stubkit.py) run under
    # AnyIO's plugin on their ``anyio_backend``, not under pytest-trio's trio mode, which has
    # just marked every async test ``trio``.
    for item in items:
        if item.get_closest_marker("anyio") is not None:
            item.own_markers[:] = [m for m in item.own_markers if m.name != "trio"]
    # scripts/test runs the suite twice: with the compiled fast path, then with
    # --read-path-pass on the pure-Python path, where only the tests whose outcome can depend
    # on the read path run again (the rest are deselected, and pytest's summary says how many).
    if not config.getoption("--read-path-pass"):
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        (drop if one_pass(item) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A Spark failure (a Py4J error) names its Java root cause first in pytest's summary
    line (cut at the terminal's width) and gives the chain a section of its own: the
    outermost Java error (e.g. "Multiple failures in stage materialization ... Boxed
    Exception") says nothing, and the "Caused by" lines are deep in a long stack trace."""
    report = yield
    if call.excinfo is not None and hasattr(call.excinfo.value, "java_exception"):
        from gossiprouter.analytics.cli import java_causes

        chain = java_causes(call.excinfo.value)
        if len(chain) > 1:
            report.sections.append(("Java cause chain (outermost first)", "\n".join(chain)))
            crash = getattr(report.longrepr, "reprcrash", None)
            if crash is not None:
                crash.message = f"root cause {chain[-1]}, under {chain[0]}"
    return report


@pytest.fixture
async def start_router(nursery: trio.Nursery, request: pytest.FixtureRequest) -> RouterFactory:
    """Start a router with the given Config overrides; returns the Server (``.address`` set)."""
    dispatcher = request.config.getoption("--dispatcher")

    async def start(**overrides: object) -> Server:
        if dispatcher is not None:
            overrides.setdefault("dispatcher", dispatcher == "on")
        cfg = Config(host="127.0.0.1", port=0, **overrides)  # type: ignore[arg-type]
        server = Server(cfg, hooks=Operations(cfg))
        await nursery.start(server.serve)
        return server

    return start


@pytest.fixture
async def router(start_router: RouterFactory) -> Server:
    return await start_router()


def ops_of(server: Server) -> Operations:
    """The operations hooks of a router started by :func:`start_router` (the server itself
    knows them only as :class:`gossiprouter.server.hooks.ServerHooks`)."""
    assert isinstance(server.hooks, Operations)
    return server.hooks


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    """One local Spark per test module that needs it (imported lazily: most tests don't).

    Tiny data: few partitions (every task has a fixed cost), and no optimising JIT
    compiler (it costs more CPU than it saves in a run this short; halves the test time),
    with the code cache a small run's analysis gets (sizing.QUICK_JVM_OPTIONS: the JVM
    serves every Spark module of the process, and C1's default 48 MiB filled up in CI).
    Its JVM maps a class archive of its own (analytics/jvm_archive, kind "tests": the first
    such JVM of a machine writes it, at its stop), not ``gossiprouter analyze``'s, which would
    then hold only the classes the tests load."""
    from gossiprouter.analytics.sizing import QUICK_JVM_OPTIONS
    from gossiprouter.analytics.spark_io import DRIVER_JAVA_OPTIONS, spark_session, stop_session

    session = spark_session("local[2]", conf={
        "spark.sql.shuffle.partitions": "2",
        DRIVER_JAVA_OPTIONS: QUICK_JVM_OPTIONS,
    }, share_classes="tests")
    yield session
    stop_session(session)


TopicsScenario = Callable[..., Path]


@pytest.fixture
def topics_scenario(tmp_path: Path) -> TopicsScenario:
    """Writes a short federated topics scenario (two routers, one publisher) for end-to-end
    runs and returns its path; skips the test when mosquitto, the federation's broker, is
    not installed (scripts/setup installs it)."""
    if not shutil.which(MOSQUITTO):
        pytest.fail("mosquitto is not installed")

    def write(*, duration: float, drain: float, subscribers: int, rate: float,
              churn_interval: float, settle: float, patterns: list[str]) -> Path:
        f = tmp_path / "t.toml"
        f.write_text(f'kind = "topics"\nduration = {duration}\ndrain = {drain}\nrouters = 2\n'
                     f'[topics]\npublishers = 1\nsubscribers = {subscribers}\nrate = {rate}\n'
                     f'churn_interval = {churn_interval}\nsettle = {settle}\n'
                     f'patterns = {json.dumps(patterns)}\n')
        return f

    return write
