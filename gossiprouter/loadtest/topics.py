"""``gossiprouter loadtest-topics``: a load test of topic multicast across a federation.

A scenario (``scripts/scenarios/topics.toml``) starts ``routers`` routers on free ports of
127.0.0.1, federated through a mosquitto it also starts; ``publishers`` and
``subscribers`` members per router (one RouterStub each) publish and subscribe with
wildcard patterns, and the subscribers churn (change a pattern) while the load runs.
Everything runs in this one process, so send and receive times share one clock. The
scenario file and its checks are :mod:`gossiprouter.loadtest.topics_scenario`; this module
is the run, its audit and the command.

**The audit knows the expected receivers.** At every send the runner records which
subscribers' patterns matched at that moment (from its own subscription state, the same
rule as the router's, :func:`gossiprouter.core.topics.matches`): a local publication is expected
at the subscribers of the publisher's router, a global one at the subscribers of every
router. A subscriber whose subscriptions are changing (from the request until ``settle``
seconds after the router accepted it, time for a remote bridge to subscribe the broker) is
*in flux* and is neither expected nor counted as unexpected for that send. The audit then
reports, per scope, the expected deliveries, those **lost** (expected, never received),
**duplicated** (received more than once) and **unexpected** (received by a settled
subscriber whose patterns did not match, or outside the scope), and the latency
percentiles. Healthy members lose nothing while the broker is up: the command exits 1 if
anything was lost, duplicated or unexpected.

This audit is plain Python over in-memory records. With ``--out RUN_DIR`` the run also
writes its records as Parquet (publications, subscription spans, deliveries; layout in
:mod:`gossiprouter.loadtest.topic_records`) and a manifest, and ``gossiprouter analyze
RUN_DIR`` audits them with Spark (:mod:`gossiprouter.analytics.topics_audit`), computing
the expected receivers itself from the subscription spans: the two audits are independent
and must agree.
"""

from __future__ import annotations

import dataclasses
import datetime
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import trio

from gossiprouter.core.topics import (
    TopicId,
    format_topic,
    matches,
    parse_topic,
    pattern,
    topic_id,
)
from gossiprouter.loadtest.errors import first_error
from gossiprouter.loadtest.pacing import Pacer, PaceStats
from gossiprouter.loadtest.resources import (
    ResourceSampler,
    host_facts,
    metrics_available,
    own_usage,
    scrape_router,
)
from gossiprouter.loadtest.topics_scenario import (
    STAMP,
    TopicsScenario,
    TopicsScenarioError,
    load_topics_scenario,
)
from gossiprouter.stub import Channel, Publication, RouterStub

GROUP = "topics-load"
_STUB = {"reconnect_initial": 0.05, "reconnect_max": 0.5, "heartbeat_interval": 1.0,
         "heartbeat_timeout": 5.0, "send_timeout": 5.0, "request_timeout": 5.0,
         "receive_buffer": 100_000}


# --------------------------------------------------------------------------- records


def _ns(t: float) -> int:
    return round(t * 1e9)


@dataclass
class Sent:
    pub: int
    seq: int
    scope: str
    at: float
    expected: frozenset[int]
    flux: frozenset[int]
    topic: str = ""
    router: int = 0


@dataclass
class Span:
    """A span during which a subscriber held a pattern (trio clock, seconds): requested at
    ``start``, settled at ``settled`` (accepted + settle), unsubscribe requested at ``end``
    and settled at ``end_settled``; None for what did not happen."""

    pattern: str
    start: float
    settled: float | None = None
    end: float | None = None
    end_settled: float | None = None


@dataclass
class Subscriber:
    index: int
    router: int
    channel: Channel
    patterns: set[TopicId] = field(default_factory=set)
    flux_until: float = 0.0  # in flux until then (inf while a change is under way)
    received: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    # Pattern changes as [start - settle, end + settle]: a publication sent just before a
    # change may reach the router after it, so those sends are in flux too.
    changes: list[list[float]] = field(default_factory=list)
    name: str = ""
    spans: list[Span] = field(default_factory=list)
    # (pub, seq, scope) of each copy, in arrival order, for the Parquet records.
    arrivals: list[tuple[int, int, str, float]] = field(default_factory=list)

    def in_flux(self, t: float) -> bool:
        return any(a <= t <= b for a, b in self.changes)


@dataclass
class Report:
    rows: dict[str, dict[str, float]]
    total_lost: int
    total_duplicated: int
    total_unexpected: int


def audit(sent: Sequence[Sent], subs: Sequence[Subscriber]) -> Report:
    """Lost, duplicated and unexpected deliveries, and latency by scope."""
    rows: dict[str, dict[str, float]] = {}
    lat: dict[str, list[float]] = {"local": [], "global": []}
    counts = {s: {"sent": 0, "expected": 0, "delivered": 0, "lost": 0, "duplicated": 0,
                  "unexpected": 0} for s in ("local", "global")}
    for m in sent:
        c = counts[m.scope]
        c["sent"] += 1
        key = (m.pub, m.seq)
        for sub in subs:
            got = sub.received.get(key, [])
            if sub.index in m.flux or sub.in_flux(m.at):
                continue
            if sub.index in m.expected:
                c["expected"] += 1
                if not got:
                    c["lost"] += 1
                else:
                    c["delivered"] += 1
                    c["duplicated"] += len(got) - 1
                    lat[m.scope].append(got[0] - m.at)
            elif got:
                c["unexpected"] += len(got)
    for scope, c in counts.items():
        ls = sorted(lat[scope])

        def pct(q: float, ls: list[float] = ls) -> float:
            return ls[min(len(ls) - 1, int(q * len(ls)))] * 1000 if ls else float("nan")

        rows[scope] = {**c, "p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": pct(1.0)}
    return Report(rows, sum(c["lost"] for c in counts.values()),
                  sum(c["duplicated"] for c in counts.values()),
                  sum(c["unexpected"] for c in counts.values()))


# --------------------------------------------------------------------------- the run


class ProcessExited(RuntimeError):
    """A process the run started exited before it listened; ``log`` is where it wrote."""

    def __init__(self, what: str, status: int, log: Path | None) -> None:
        where = f" (its log is kept: {log})" if log is not None else ""
        super().__init__(f"{what} exited with status {status}{where}")
        self.log = log

    def last_lines(self, n: int = 5) -> list[str]:
        if self.log is None:
            return []
        try:
            return self.log.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return []


@dataclass
class Recorded:
    """What a run recorded: every publication, every subscriber (with its spans and
    arrivals), and the start of the load on the trio clock."""

    sent: list[Sent]
    subs: list[Subscriber]
    t0: float
    # The publishers' send slots (late, skipped: gossiprouter.loadtest.pacing).
    pacing: PaceStats = field(default_factory=PaceStats)
    # The routers' and this process's CPU and memory (gossiprouter.loadtest.resources).
    resources: dict[str, Any] = field(default_factory=dict)


def publisher_name(sc: TopicsScenario, index: int) -> str:
    return f"p{index // sc.publishers}-{index % sc.publishers}"


def _manifest(sc: TopicsScenario, source: Path | None, run: str, status: str,
              **extra: Any) -> dict[str, Any]:
    from gossiprouter.loadtest.topic_records import KIND

    return {"kind": KIND, "run": run, "scenario": sc.name,
            "scenario_file": str(source) if source else None,
            "scenario_config": dataclasses.asdict(sc), "settle_s": sc.settle,
            "status": status, **extra}


def write_run(out: Path, sc: TopicsScenario, rec: Recorded, run: str) -> None:
    """The run's records as Parquet under ``out`` (layout in
    :mod:`gossiprouter.loadtest.topic_records`)."""
    # Imported here: pyarrow is the loadtest extra's, and the main CLI imports this module.
    from gossiprouter.loadtest.topic_records import (
        DELIVERIES_FILE,
        PUBLICATIONS_FILE,
        SUBSCRIPTIONS_FILE,
        write_topic_table,
    )

    pubs: dict[str, list[object]] = {k: [] for k in (
        "run", "pub_id", "publisher", "router", "scope", "topic", "size", "t_send_ns")}
    for m in rec.sent:
        name = publisher_name(sc, m.pub)
        for k, v in (("run", run), ("pub_id", f"{name}/{m.seq}"), ("publisher", name),
                     ("router", m.router), ("scope", m.scope), ("topic", m.topic),
                     ("size", sc.size), ("t_send_ns", _ns(m.at))):
            pubs[k].append(v)
    spans: dict[str, list[object]] = {k: [] for k in (
        "run", "subscriber", "router", "pattern", "from_ns", "settled_from_ns", "to_ns",
        "settled_to_ns")}
    recvs: dict[str, list[object]] = {k: [] for k in (
        "run", "pub_id", "receiver", "router", "scope", "t_recv_ns")}

    def opt(t: float | None) -> int | None:
        return None if t is None else _ns(t)

    for sub in rec.subs:
        for sp in sub.spans:
            row: tuple[tuple[str, object], ...] = (
                ("run", run), ("subscriber", sub.name), ("router", sub.router),
                ("pattern", sp.pattern), ("from_ns", _ns(sp.start)),
                ("settled_from_ns", opt(sp.settled)), ("to_ns", opt(sp.end)),
                ("settled_to_ns", opt(sp.end_settled)))
            for key, val in row:
                spans[key].append(val)
        for pub, seq, scope, at in sub.arrivals:
            for k, v in (("run", run), ("pub_id", f"{publisher_name(sc, pub)}/{seq}"),
                         ("receiver", sub.name), ("router", sub.router), ("scope", scope),
                         ("t_recv_ns", _ns(at))):
                recvs[k].append(v)
    write_topic_table(out, PUBLICATIONS_FILE, pubs)
    write_topic_table(out, SUBSCRIPTIONS_FILE, spans)
    write_topic_table(out, DELIVERIES_FILE, recvs)


def _now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


async def run_topics(sc: TopicsScenario, echo: Any = print, out: Path | None = None,
                     source: Path | None = None) -> Report:
    """Run the scenario and audit it in-process; with ``out`` also write the run directory
    (records and manifest) that ``gossiprouter analyze`` audits with Spark."""
    if out is None:
        return audit_recorded(await _run(sc, echo))
    # Imported here: pyarrow is the loadtest extra's, and the main CLI imports this module.
    from gossiprouter.loadtest.records import write_manifest

    run = f"{sc.name}-{time.strftime('%Y%m%dT%H%M%S')}-{random.randrange(16**6):06x}"
    started = _now_iso()
    out.mkdir(parents=True, exist_ok=True)
    write_manifest(out, _manifest(sc, source, run, "running", started_at=started))
    status = "failed"
    try:
        rec = await _run(sc, echo)
        status = "ok"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        if status != "ok":
            write_manifest(out, _manifest(sc, source, run, status, started_at=started,
                                          finished_at=_now_iso()))
    rep = audit_recorded(rec)
    write_run(out, sc, rec, run)
    write_manifest(out, _manifest(
        sc, source, run, status, started_at=started, finished_at=_now_iso(),
        t0_ns=_ns(rec.t0), in_process_audit=rep.rows, resources=rec.resources, **host_facts(),
        counters={"publishers": {"sent": len(rec.sent), **rec.pacing.counters()}}))
    return rep


def audit_recorded(rec: Recorded) -> Report:
    return audit(rec.sent, rec.subs)


async def _run(sc: TopicsScenario, echo: Any) -> Recorded:
    # Imported here: the process supervision uses rich (the loadtest extra's), and the main
    # CLI imports this module.
    from gossiprouter.loadtest.processes import ExitedAtStart, SpawnedFederation

    rnd = random.Random(sc.seed)
    tmp = Path(tempfile.mkdtemp(prefix="gossiprouter-topics-"))
    fed = SpawnedFederation(sc.routers, (), tmp, metrics=metrics_available())
    keep = False
    try:
        async with trio.open_nursery() as n:
            try:
                await fed.start(n)
                echo(f"{sc.name}: {sc.routers} routers, mosquitto on {fed.broker.port}, "
                     f"{sc.publishers}x{sc.routers} publishers, {sc.subscribers}x{sc.routers} "
                     f"subscribers, {sc.duration:g} s")
                return await _load(sc, rnd, [r.port for r in fed.routers], fed.metrics)
            finally:
                with trio.CancelScope(shield=True):
                    await fed.stop()
                n.cancel_scope.cancel()
    except BaseExceptionGroup as e:
        # The supervisors' one-line LoadTestError (a process died), not a group.
        err = first_error(e)
        if err is None:
            raise
        if isinstance(err, ExitedAtStart):
            keep = True  # the user reads why it exited
            raise ProcessExited(err.what, err.status or 0, err.log) from None
        raise RuntimeError(str(err)) from None
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


def _choose(sc: TopicsScenario, rnd: random.Random) -> TopicId:
    p = rnd.choice(sc.patterns).replace("{p}", str(rnd.randrange(sc.publishers * sc.routers)))
    return pattern(*parse_topic(p))


def _publication_id(pub: int, rnd: random.Random) -> TopicId:
    return topic_id(f"v{pub}", "pos", [rnd.choice(["eu", "us"]), rnd.choice(["de", "fr"])])


async def _sample(sampler: ResourceSampler, metrics: list[str], t0: float) -> None:
    """The routers' CPU and memory and this process's (every publisher and subscriber is
    in it), about once a second, until cancelled."""
    while True:
        procs: dict[str, tuple[float | None, int | None]] = {}
        for i, address in enumerate(metrics):
            scraped = await trio.to_thread.run_sync(scrape_router, address,
                                                    abandon_on_cancel=True)
            if scraped is not None:
                procs[f"router-{i}"] = (scraped.cpu_s, scraped.rss_bytes)
                sampler.router_settings = scraped.settings
        procs["loader"] = own_usage()
        sampler.add(trio.current_time() - t0, procs)
        await trio.sleep(sampler.interval_s)


async def _load(sc: TopicsScenario, rnd: random.Random, ports: list[int],
                metrics: Sequence[str] = ()) -> Recorded:
    subs: list[Subscriber] = []
    sent: list[Sent] = []
    async with trio.open_nursery() as n:
        stubs: list[RouterStub] = []

        async def stub_for(port: int) -> RouterStub:
            s = RouterStub([("127.0.0.1", port)], **_STUB)  # type: ignore[arg-type]
            await n.start(_hold, s)
            stubs.append(s)
            return s

        for r, port in enumerate(ports):
            for i in range(sc.subscribers):
                ch = await (await stub_for(port)).connect(GROUP, b"s%d-%d" % (r, i))
                sub = Subscriber(len(subs), r, ch, name=f"s{r}-{i}")
                for _ in range(2):
                    pat = _choose(sc, rnd)
                    span = Span(format_topic(pat), trio.current_time())
                    await ch.subscribe(*pat)
                    span.settled = trio.current_time() + sc.settle
                    sub.patterns.add(pat)
                    sub.spans.append(span)
                subs.append(sub)
        pubs: list[tuple[int, Channel]] = []
        for r, port in enumerate(ports):
            for i in range(sc.publishers):
                ch = await (await stub_for(port)).connect(GROUP, b"p%d-%d" % (r, i))
                pubs.append((r, ch))
        await trio.sleep(sc.settle + 0.5)  # every bridge has subscribed the broker
        t0 = trio.current_time()
        t_end = t0 + sc.duration
        pacing = PaceStats()
        sampler = ResourceSampler()

        async def receive(sub: Subscriber) -> None:
            async for m in sub.channel:
                if isinstance(m, Publication):
                    pub, seq, _ = STAMP.unpack_from(m.payload)
                    now = trio.current_time()
                    sub.received.setdefault((pub, seq), []).append(now)
                    sub.arrivals.append((pub, seq, m.scope, now))

        async def publish(index: int, router: int, ch: Channel) -> None:
            prng = random.Random(sc.seed * 1000 + index)
            seq = 0
            pacer = Pacer(sc.rate, t0, pacing)
            while pacer.next_t < t_end:
                await pacer.wait()
                tid = _publication_id(index, prng)
                scope = "global" if prng.random() < sc.global_share else "local"
                now = trio.current_time()
                expected, flux = set(), set()
                for s in subs:
                    if scope == "local" and s.router != router:
                        continue
                    if s.flux_until > now:
                        flux.add(s.index)
                    elif any(matches(p, tid) for p in s.patterns):
                        expected.add(s.index)
                payload = STAMP.pack(index, seq, now).ljust(sc.size, b".")
                sent.append(Sent(index, seq, scope, now, frozenset(expected), frozenset(flux),
                                 format_topic(tid), router))
                await ch.publish(tid, payload, scope=scope)  # type: ignore[arg-type]
                seq += 1

        async def churn(sub: Subscriber) -> None:
            prng = random.Random(sc.seed * 7919 + sub.index)
            while True:
                await trio.sleep(prng.expovariate(1.0 / sc.churn_interval))
                if trio.current_time() >= t_end:
                    return
                old = prng.choice(sorted(sub.patterns))
                new = _choose(sc, prng)
                sub.flux_until = float("inf")
                start = trio.current_time()
                change = [start - sc.settle, float("inf")]
                sub.changes.append(change)
                sub.patterns.discard(old)
                # The router holds a pattern once: the unsubscribe ends every span of it.
                ending = [sp for sp in sub.spans
                          if sp.pattern == format_topic(old) and sp.end is None]
                for sp in ending:
                    sp.end = start
                await sub.channel.unsubscribe(*old)
                unsubscribed = trio.current_time()
                for sp in ending:
                    sp.end_settled = unsubscribed + sc.settle
                span = Span(format_topic(new), unsubscribed)
                sub.spans.append(span)
                await sub.channel.subscribe(*new)
                sub.patterns.add(new)
                sub.flux_until = change[1] = trio.current_time() + sc.settle
                span.settled = change[1]

        async with trio.open_nursery() as load:
            load.start_soon(_sample, sampler, list(metrics), t0)
            for sub in subs:
                load.start_soon(receive, sub)
                load.start_soon(churn, sub)
            async with trio.open_nursery() as senders:
                for index, (router, ch) in enumerate(pubs):
                    senders.start_soon(publish, index, router, ch)
            await trio.sleep(sc.drain)
            load.cancel_scope.cancel()
        n.cancel_scope.cancel()
    return Recorded(sent, subs, t0, pacing, sampler.to_manifest())


async def _hold(stub: RouterStub, *, task_status: trio.TaskStatus[None]) -> None:
    async with stub:
        await stub.wait_connected()
        task_status.started()
        await trio.sleep_forever()


def print_report(rep: Report, echo: Any = print) -> None:
    echo(f"{'scope':<7} {'sent':>7} {'expected':>9} {'delivered':>10} {'lost':>6} "
         f"{'dup':>5} {'unexp':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for scope, r in rep.rows.items():
        echo(f"{scope:<7} {r['sent']:>7.0f} {r['expected']:>9.0f} {r['delivered']:>10.0f} "
             f"{r['lost']:>6.0f} {r['duplicated']:>5.0f} {r['unexpected']:>6.0f} "
             f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['max_ms']:>8.2f}")


def run_topics_command(scenario_file: Path, out_dir: Path | None) -> None:
    """What ``gossiprouter loadtest`` does with a topics scenario (see loadtest_command)."""
    import importlib.util

    from gossiprouter.core.cli_errors import BadInput, CommandError, needs_extra

    try:
        sc = load_topics_scenario(scenario_file)
    except TopicsScenarioError as e:
        raise BadInput(str(e)) from None
    # Checked before anything starts: its routers would exit one after the other.
    if importlib.util.find_spec("paho") is None:
        raise CommandError(needs_extra("the topics load test", "paho-mqtt (its routers are "
                                       "federated through the bridge)", "bridge"))
    if out_dir is not None and importlib.util.find_spec("pyarrow") is None:
        raise CommandError(needs_extra("--out", "pyarrow", "loadtest"))
    if out_dir is not None and (out_dir.exists() and any(out_dir.iterdir())):
        # A second run's records beside a first one's would be audited as one run.
        raise BadInput(f"{out_dir} is not empty (the run directory must be new or empty)")
    started = time.monotonic()
    try:
        rep = trio.run(run_topics, sc, click.echo, out_dir, scenario_file)
    except ProcessExited as e:
        for line in e.last_lines():
            click.echo(f"  {line}", err=True)
        raise CommandError(str(e)) from None
    except (RuntimeError, OSError) as e:
        raise CommandError(str(e)) from None
    print_report(rep, click.echo)
    click.echo(f"{time.monotonic() - started:.1f} s")
    if out_dir is not None:
        click.echo(f"records in {out_dir}; audit them with: gossiprouter analyze {out_dir}")
    if rep.total_lost or rep.total_duplicated or rep.total_unexpected:
        raise CommandError(f"{rep.total_lost} lost, {rep.total_duplicated} duplicated, "
                           f"{rep.total_unexpected} unexpected deliveries")


@click.command("loadtest-topics", hidden=True)  # listed as loadtest
@click.argument("scenario_file", metavar="SCENARIO",
                type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", "out_dir", metavar="RUN_DIR", default=None,
              type=click.Path(file_okay=False, path_type=Path),
              help="Also write the run's records (Parquet) and manifest there, for "
                   "`gossiprouter analyze RUN_DIR`; it must be new or empty.")
def loadtest_topics_command(scenario_file: Path, out_dir: Path | None) -> None:
    """The old name of `gossiprouter loadtest` for a topics scenario (kept for scripts).

    `gossiprouter loadtest SCENARIO [--out RUN_DIR]` runs any scenario kind.
    """
    run_topics_command(scenario_file, out_dir)
