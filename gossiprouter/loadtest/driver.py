"""The load-test driver: starts the router and the peer processes, plays the scenario, records.

:func:`run_loadtest` does a whole run into ``RUN_DIR`` (layout in
:mod:`gossiprouter.loadtest.records`):

1. checks that ``RUN_DIR`` is new or empty, writes ``manifest.json`` (scenario, versions,
   host facts) and, with ``spawn_router``, starts ``gossiprouter serve`` on a free port of
   127.0.0.1 (its log goes to ``RUN_DIR/logs/router.log``); a scenario with ``[federation]``
   gets a mosquitto and that many routers bridged to it (``logs/router-N.log``), each member
   on its own router, and ``restart-router`` names one of them;
2. starts one ``python -m gossiprouter.loadtest.peer`` per scenario process, in a session
   of its own (so a Ctrl-C on the terminal reaches only the driver, which then stops them in
   order). Each peer is coordinated over its stdin/stdout pipes in JSON lines (the control
   channel, see :mod:`gossiprouter.loadtest.peer`); its stderr is ``RUN_DIR/logs/peer-N.log``;
3. waits until every peer has joined its initial members (the driver writes each ``join``
   to the membership timeline with the time the peer took after the router's acknowledgement),
   then sends every peer ``start`` with one ``t0`` a little in the future on the shared
   monotonic clock, so all start sending together;
4. plays the timed events at ``t0 + at``, one after the other: ``leave``/``join`` go to the
   member's peer, which answers with the time it took (the driver records it); ``kill``
   freezes the peer (it stops recording, stops sending and flushes its records), records
   ``killed`` for each of its joined members, then sends SIGKILL; ``restart-router`` stops
   the spawned router (SIGTERM or SIGKILL), waits ``down`` seconds and starts it again on the
   same port, then watches (``GET_MBRS``) until every member is registered again. Each
   event played goes to the manifest's ``events`` list with its times, so the analysis can
   mark them on its plots and tell a loss across a reconnect from an unexplained one;
5. waits for every live peer to finish (they stop sending at ``t0 + duration``, keep
   receiving for ``drain`` seconds, flush, report their counters and leave), stops the
   router and completes the manifest with the outcome.

All along it shows live progress, collecting each peer's counters from its periodic
``stats`` line. Any failure (a peer or the router dying unexpectedly, a timeout) raises
:class:`LoadTestError` with a one-line message; on any exit, Ctrl-C included, every child
process is stopped (SIGTERM, then SIGKILL after a bounded wait). Every wait is bounded.

This module is the player (the steps above). The timed events of step 4 are
:mod:`gossiprouter.loadtest.events`, the display is
:mod:`gossiprouter.loadtest.progress`, the child processes and their supervision are
:mod:`gossiprouter.loadtest.processes`, the errors :mod:`gossiprouter.loadtest.errors`; the
names it has always exported (``LoadTestError``, ``RunInputError``, ``Progress``) still
import from here.
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import trio

from gossiprouter.core.addresses import parse_hostport
from gossiprouter.loadtest.attacks.runner import AttackRunner
from gossiprouter.loadtest.errors import LoadTestError, RunInputError, first_error
from gossiprouter.loadtest.events import EventPlayer
from gossiprouter.loadtest.pacing import trio_time_at
from gossiprouter.loadtest.processes import (
    CLEANUP_WAIT,
    HOST,
    PeerProcess,
    SpawnedFederation,
    SpawnedRouter,
    can_connect,
    free_port,
    wait_exit,
)
from gossiprouter.loadtest.progress import PeerView, Progress, rates_line, total_view
from gossiprouter.loadtest.records import (
    MANIFEST_FILE,
    MEMBERSHIP_FILE,
    RECORDS_DIR,
    MembershipWriter,
    write_manifest,
)
from gossiprouter.loadtest.resources import (
    ResourceSampler,
    host_facts,
    metrics_available,
    metrics_option,
    scrape_router,
)
from gossiprouter.loadtest.scenario import Scenario

__all__ = [
    "LoadTestError",
    "Progress",
    "RunInputError",
    "RunResult",
    "first_error",
    "run_loadtest",
]

PEER_READY_TIMEOUT: Final = 60.0  # plus a little per member, see _ready_timeout
START_LEAD_S: Final = 0.3  # t0 is this far ahead of the start command: all get it in time
FINISH_GRACE: Final = 30.0  # after the drain, for the peers to flush, report and leave
STATS_INTERVAL: Final = 0.5
LOGS_DIR: Final = "logs"


# --------------------------------------------------------------------------- results


@dataclass
class RunResult:
    """What a finished run did (the analysis of ``run_dir`` says what was delivered)."""

    run_id: str
    run_dir: Path
    router: str
    seconds: float
    sent: int
    received: int
    errors: int
    dropped: int
    killed: list[int]
    router_restarts: int
    record_files: int
    send_errors: int = 0
    router_errors: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    framing_violations: int = 0  # frames the peers received that did not parse

    def summary(self, scenario: Scenario) -> str:
        """A few lines for the terminal."""
        n_members = len(scenario.members)
        errors = f"errors {self.errors:,}"
        if self.errors:
            # Router errors are what the router reports about traffic: unicasts to a member
            # that left or was killed come back as unknown_destination, say.
            codes = ", ".join(f"{n:,} {code}" for code, n in sorted(self.router_errors.items()))
            errors += f" (send failures {self.send_errors:,}" + (
                f"; from the router: {codes})" if codes else ")")
        lines = [
            f"loadtest {scenario.name}: run {self.run_id}, {self.seconds:.1f} s, "
            f"{_n(scenario.processes, 'process')}, {_n(n_members, 'member')} in "
            f"{_n(len(scenario.groups), 'group')}, router {self.router}",
            f"sent {self.sent:,} messages, recorded {self.received:,} deliveries, "
            f"{errors}, dropped {self.dropped:,}"
            + (f", killed processes {', '.join(map(str, self.killed))}" if self.killed else "")
            + (f", router restarts {self.router_restarts}" if self.router_restarts else ""),
            rates_line(scenario, self.sent, self.errors, self.send_errors),
            f"run directory: {self.run_dir} ({self.record_files} record files, "
            f"{MEMBERSHIP_FILE}, {MANIFEST_FILE}, {LOGS_DIR}/)",
        ]
        if self.framing_violations:
            lines.append(f"stream integrity: {self.framing_violations:,} frames from the router "
                         "did not parse (a frame cut into another?): the analysis fails the run")
        lines += [f"warning: {w}" for w in self.warnings]
        lines.append(f"next: gossiprouter analyze {self.run_dir}")
        return "\n".join(lines)


def _n(count: int, noun: str) -> str:
    """``1 group``, ``2 groups``, ``3 processes``."""
    if count == 1:
        return f"1 {noun}"
    return f"{count:,} {noun}{'es' if noun.endswith('s') else 's'}"


# --------------------------------------------------------------------------- the run


def parse_router_option(value: str) -> tuple[str, int]:
    """``HOST:PORT`` of an existing router, which must be on 127.0.0.1 (one machine, one
    monotonic clock for every record)."""
    try:
        host, port = parse_hostport(value)
    except ValueError as e:
        raise RunInputError(f"--router {value!r}: {e}") from None
    if host not in ("127.0.0.1", "localhost"):
        raise RunInputError(f"--router {value!r}: the load test runs on one machine, so the "
                            "router must be on 127.0.0.1")
    return HOST, port


def prepare_run_dir(run_dir: Path) -> None:
    """Create ``run_dir``, which must not exist yet or be empty (one run per directory), or
    hold a run that failed before it recorded anything (then it is emptied: the same
    command works again once its cause is fixed)."""
    if run_dir.exists():
        if not run_dir.is_dir():
            raise RunInputError(f"--out {run_dir}: exists and is not a directory")
        if _failed_before_recording(run_dir):
            for entry in run_dir.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        if any(run_dir.iterdir()):
            raise RunInputError(f"--out {run_dir}: the directory is not empty (use a new "
                                "directory for each run)")
    try:
        (run_dir / RECORDS_DIR).mkdir(parents=True, exist_ok=True)
        (run_dir / LOGS_DIR).mkdir(exist_ok=True)
    except OSError as e:
        raise RunInputError(f"--out {run_dir}: cannot create it: {e.strerror or e}") from None


class _Run:
    def __init__(self, scenario: Scenario, run_dir: Path, router: tuple[str, int] | None,
                 progress: Progress, scenario_file: str | None) -> None:
        self.s = scenario
        self.run_dir = run_dir
        self.progress = progress
        self.spawn = router is None
        self.port = free_port() if router is None else router[1]
        self.router_addr = f"{HOST}:{self.port}"
        self.router: SpawnedRouter | None = None
        self.attacks = AttackRunner(scenario.attacks, run_dir, router_args=scenario.router_args,
                                    spawned=self.spawn)
        # With [federation]: a mosquitto and its routers; self.router is router 0, the one
        # the attacks and the progress line name.
        self.federation: SpawnedFederation | None = None
        # A spawned router's metrics port, scraped for its CPU, memory and settings (not a
        # federation's routers: they share their arguments, so not one metrics port).
        self.metrics_addr: str | None = None
        self.sampler = ResourceSampler()
        args = scenario.router_args + self.attacks.router_args
        if scenario.federation:
            self.federation = SpawnedFederation(scenario.federation, args, run_dir / LOGS_DIR)
            self.router = self.federation.routers[0]
            self.port = self.router.port
            self.router_addr = f"{HOST}:{self.port}"
        elif self.spawn:
            self.metrics_addr = metrics_option(args)
            if self.metrics_addr is None and metrics_available():
                self.metrics_addr = f"{HOST}:{free_port()}"
                args += ("--metrics", self.metrics_addr)
            self.router = SpawnedRouter(self.port, args, run_dir / LOGS_DIR / "router.log")
        self.spawned = self.federation.routers if self.federation else (
            [self.router] if self.router else [])
        self.addresses = self.federation.addresses if self.federation else [self.router_addr]
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        self.run_id = f"{scenario.name}-{stamp}-{secrets.token_hex(2)}"
        self.membership = MembershipWriter(run_dir / MEMBERSHIP_FILE, autoflush=False)
        self.peers = [PeerProcess(p, scenario.members_of_process(p),
                                  run_dir / LOGS_DIR / f"peer-{p}.log")
                      for p in range(scenario.processes)]
        self.t0_ns: int | None = None
        self.phase = "starting"
        self.pending_events = list(scenario.events)
        self.killed: list[int] = []
        self.warnings: list[str] = list(self.attacks.warnings)
        self.started_at = datetime.datetime.now(datetime.UTC)
        self.manifest: dict[str, Any] = {
            "format": "gossiprouter-loadtest-run/1",
            "run": self.run_id,
            "scenario": scenario.name,
            "scenario_file": scenario_file,
            "scenario_config": scenario.to_dict(),
            "router": {"address": self.router_addr, "spawned": self.spawn,
                       **({"federation": {"broker": self.federation.broker.url,
                                          "routers": self.addresses}}
                          if self.federation else {})},
            "processes": [{"proc": p.proc_no, "log": f"{LOGS_DIR}/peer-{p.proc_no}.log",
                           "members": [m.name for m in p.members]} for p in self.peers],
            **host_facts(),
            "started_at": self.started_at.isoformat(timespec="seconds"),
            "status": "running",
            # The events as played, with times on the run's monotonic clock (t_ns); see
            # EventPlayer. Written with the rest of the manifest when the run ends.
            "events": [],
        }
        self.events = EventPlayer(scenario, self.peers, self.spawned, self.addresses,
                                  federated=self.federation is not None,
                                  membership=self.membership, progress=progress,
                                  played=self.manifest["events"], warnings=self.warnings,
                                  killed=self.killed)

    # -- bookkeeping ---------------------------------------------------------------------

    def on_message(self, peer: PeerProcess, msg: dict[str, Any]) -> None:
        ev = msg.get("ev")
        if ev == "joined":
            member, group = str(msg["member"]), str(msg["group"])
            peer.joined[member] = group
            self.membership.join(group, member, int(msg["t_ns"]))
        elif ev == "left":
            member, group = str(msg["member"]), str(msg["group"])
            peer.joined.pop(member, None)
            self.membership.leave(group, member, int(msg["t_ns"]))

    def snapshot(self) -> tuple[str, list[PeerView]]:
        elapsed = self.progress.elapsed()
        nxt = self.pending_events[0] if self.pending_events else None
        title = f"{self.s.name} ({self.run_id}): {self.phase}"
        if self.t0_ns is not None:
            title += f", {min(elapsed, self.s.duration + self.s.drain):.1f} s of " \
                     f"{self.s.duration:g} s + {self.s.drain:g} s drain"
        if nxt is not None:
            title += f"; next at {nxt.at:g} s: {nxt.describe()}"
        title += f"; router {self.router_addr}"
        return title, [p.view() for p in self.peers]

    def write_manifest(self) -> None:
        write_manifest(self.run_dir, self.manifest)

    # -- phases --------------------------------------------------------------------------

    async def run(self) -> RunResult:
        self.write_manifest()
        self.membership.flush()
        started = time.monotonic()
        status = "failed"
        try:
            async with trio.open_nursery() as nursery:
                try:
                    await self._run(nursery)
                    status = "ok"
                except KeyboardInterrupt:
                    status = "interrupted"
                    raise
                finally:
                    with trio.CancelScope(shield=True):
                        await self._cleanup()
                    nursery.cancel_scope.cancel()
        except BaseException as e:
            if _contains(e, KeyboardInterrupt):
                status = "interrupted"
            raise
        finally:
            self.membership.flush()
            self.manifest["status"] = status
            self.manifest["finished_at"] = datetime.datetime.now(datetime.UTC).isoformat(
                timespec="seconds")
            self.manifest["t0_ns"] = self.t0_ns
            self.manifest["killed_processes"] = self.killed
            self.manifest["router_restarts"] = self._restarts()
            self.manifest["counters"] = {p.name: {k: v for k, v in p.stats.items()
                                                  if k not in ("ev", "t_ns")}
                                         for p in self.peers}
            self.manifest["warnings"] = self.warnings
            self.manifest["resources"] = self.sampler.to_manifest()
            self.write_manifest()
        totals = total_view([p.view() for p in self.peers])
        router_errors: dict[str, int] = {}
        for p in self.peers:
            for code, n in dict(p.stats.get("router_errors_by_code") or {}).items():
                router_errors[code] = router_errors.get(code, 0) + int(n)
        return RunResult(
            run_id=self.run_id, run_dir=self.run_dir, router=self.router_addr,
            seconds=time.monotonic() - started, sent=totals.sent, received=totals.received,
            errors=totals.errors, dropped=totals.dropped, killed=self.killed,
            router_restarts=self._restarts(),
            record_files=sum(1 for p in (self.run_dir / RECORDS_DIR).glob("*.parquet")),
            send_errors=sum(int(p.stats.get("send_errors", 0)) for p in self.peers),
            router_errors=router_errors, warnings=self.warnings,
            framing_violations=sum(int(p.stats.get("framing_violations", 0))
                                   for p in self.peers))

    async def _run(self, nursery: trio.Nursery) -> None:
        s, say = self.s, self.progress.log
        if self.federation is not None:
            say(f"starting mosquitto and {self.s.federation} routers federated through it on "
                f"{', '.join(self.addresses)}")
            await self.federation.start(nursery)
        elif self.router is not None:
            say(f"starting the router on {self.router_addr}")
            await self.router.start(nursery)
        elif not await can_connect(self.port):
            raise LoadTestError(f"cannot reach the router at {self.router_addr}")
        say(f"starting {_n(s.processes, 'peer process')} ({_n(len(s.members), 'member')} in "
            f"{_n(len(s.groups), 'group')}, one RouterStub {s.stubs.replace('-', ' ')})")
        config = {"cmd": "config", "run": self.run_id, "routers": self.addresses,
                  "records_dir": str(self.run_dir / RECORDS_DIR), "scenario": s.to_dict(),
                  "stats_interval": STATS_INTERVAL}
        for p in self.peers:
            await p.start()
            nursery.start_soon(p.read_loop, self.on_message)
            nursery.start_soon(p.supervise)
            await p.send({**config, "proc": p.proc_no})
        nursery.start_soon(self.progress.run, self.snapshot)

        self.phase = "joining"
        timeout = PEER_READY_TIMEOUT + 0.01 * len(s.members)
        with trio.move_on_after(timeout):
            for p in self.peers:
                await p.ready.wait()
                p.state = "ready"
        waiting = [p.name for p in self.peers if not p.ready.is_set()]
        if waiting:
            raise LoadTestError(f"peer processes {', '.join(waiting)} did not join their "
                                f"members within {timeout:g} s")
        self.membership.flush()

        say(f"all {len(s.members)} initial members joined; sending for {s.duration:g} s")
        self.t0_ns = time.monotonic_ns() + round(START_LEAD_S * 1e9)
        for p in self.peers:
            await p.send({"cmd": "start", "t0_ns": self.t0_ns})
            p.state = "running"
        self.progress.set_t0(self.t0_ns)
        self.phase = "sending"
        nursery.start_soon(self._sample_resources)
        if self.attacks.active:
            nursery.start_soon(self.attacks.run, self.router_addr, self.t0_ns,
                               self.t0_ns + round(s.duration * 1e9), say)

        while self.pending_events:
            ev = self.pending_events[0]
            await trio.sleep_until(trio_time_at(self.t0_ns + round(ev.at * 1e9)))
            await self.events.play(nursery, ev)
            self.pending_events.pop(0)
            self.membership.flush()

        send_end = self.t0_ns + round(s.duration * 1e9)
        await trio.sleep_until(trio_time_at(send_end))
        self.phase = "draining"
        say(f"sending stopped; draining for {s.drain:g} s")
        end = trio_time_at(send_end + round(s.drain * 1e9)) + FINISH_GRACE
        live = [p for p in self.peers if p.proc_no not in self.killed]
        with trio.move_on_at(end):
            for p in live:
                await p.finished.wait()
                assert p.process is not None
                await p.process.wait()
        late = [p.name for p in live if not p.finished.is_set() or p.alive]
        if late:
            raise LoadTestError(f"peer processes {', '.join(late)} did not finish within "
                                f"{FINISH_GRACE:g} s after the drain")
        self.phase = "done"
        say("all peers finished")

    async def _sample_resources(self) -> None:
        """About once a second until the run ends: the router's CPU and memory from its
        metrics port, the peers' from their counters (gossiprouter.loadtest.resources)."""
        assert self.t0_ns is not None
        while True:
            procs: dict[str, tuple[float | None, int | None]] = {}
            taken: dict[str, float] = {}
            if self.metrics_addr is not None:
                scraped = await trio.to_thread.run_sync(scrape_router, self.metrics_addr,
                                                        abandon_on_cancel=True)
                if scraped is not None:  # None while the router is down for a restart
                    procs["router"] = (scraped.cpu_s, scraped.rss_bytes)
                    self.sampler.router_settings = scraped.settings
            for p in self.peers:
                cpu, at = p.stats.get("cpu_s"), p.stats.get("t_ns")
                if isinstance(cpu, int | float) and p.proc_no not in self.killed:
                    procs[p.name] = (float(cpu), p.stats.get("rss_bytes"))
                    if isinstance(at, int):  # its last counters, up to 0.5 s old
                        taken[p.name] = (at - self.t0_ns) / 1e9
            self.sampler.add((time.monotonic_ns() - self.t0_ns) / 1e9, procs, taken)
            await trio.sleep(self.sampler.interval_s)

    async def _cleanup(self) -> None:
        """Stop every child still running: SIGTERM (peers flush and exit), then SIGKILL."""
        alive = [p for p in self.peers if p.alive]
        for p in alive:
            p.expected_exit = True
            assert p.process is not None
            p.process.send_signal(signal.SIGTERM)
        with trio.move_on_after(CLEANUP_WAIT):
            for p in alive:
                assert p.process is not None
                await p.process.wait()
        for p in alive:
            if p.alive:
                assert p.process is not None
                p.process.kill()
                await wait_exit(p.process, CLEANUP_WAIT)
        for p in self.peers:
            if p.process is not None:
                for stream in (p.process.stdin, p.process.stdout):
                    if stream is not None:
                        await trio.aclose_forcefully(stream)
        if self.federation is not None:
            await self.federation.stop()
        elif self.router is not None:
            await self.router.stop()

    def _restarts(self) -> int:
        return sum(r.restarts for r in self.spawned)


def _contains(e: BaseException, kind: type[BaseException]) -> bool:
    if isinstance(e, kind):
        return True
    if isinstance(e, BaseExceptionGroup):
        return any(_contains(x, kind) for x in e.exceptions)
    return False


def _failed_before_recording(run_dir: Path) -> bool:
    try:
        status = json.loads((run_dir / MANIFEST_FILE).read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return False
    return status == "failed" and not any((run_dir / RECORDS_DIR).glob("*.parquet"))


async def run_loadtest(
    scenario: Scenario,
    run_dir: str | os.PathLike[str],
    *,
    router: str | None = None,
    spawn_router: bool = False,
    progress: Progress | None = None,
    scenario_file: str | None = None,
) -> RunResult:
    """Run ``scenario`` against the router at ``router`` (HOST:PORT on 127.0.0.1) or, with
    ``spawn_router``, against one started (and restarted) here; write everything to
    ``run_dir``. Raises :class:`RunInputError` for bad input and :class:`LoadTestError`
    (possibly inside an exception group) when the run fails."""
    if (router is None) == (not spawn_router):
        raise RunInputError("give either --router HOST:PORT or --spawn-router")
    address = parse_router_option(router) if router is not None else None
    if address is not None and scenario.federation:
        raise RunInputError(f"{scenario.source}: the scenario federates "
                            f"{scenario.federation} routers, which needs --spawn-router: the "
                            "tool starts them and their broker itself")
    restarts = [i for i, e in enumerate(scenario.events) if e.action == "restart-router"]
    if address is not None and restarts:
        raise RunInputError(f"{scenario.source}: the scenario restarts the router (event at "
                            f"{scenario.events[restarts[0]].at:g} s), which needs "
                            "--spawn-router: the tool restarts only a router it started")
    path = Path(run_dir)
    prepare_run_dir(path)
    out = progress or Progress.silent()
    run = _Run(scenario, path, address, out, scenario_file)
    if address is not None and scenario.router_args:
        run.warnings.append("router.args of the scenario ignored: the router is not spawned")
    return await run.run()
