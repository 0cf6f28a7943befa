"""gossiprouter against the Java JGroups 2.12 GossipRouter (``scripts/bench-vs-jgroups``).

Three routers take turns, each run on a fresh router process on 127.0.0.1:

* ``java``: ``org.jgroups.stack.GossipRouter`` from the Debian ``jgroups.jar`` (2.12.2),
  driven over the JGroups 2.12 protocol;
* ``gr-2.12``: ``python -m gossiprouter serve``, driven over the same JGroups 2.12 protocol;
* ``gr-native``: the same server, driven over gossiprouter's native protocol.

With ``--jgroups5 CLASSPATH`` (a local JGroups 5.x build: a jar or a classes directory; none is
shipped or built here) two more take part, as a fourth protocol column:

* ``java5``: ``org.jgroups.stack.GossipRouter`` from that classpath, with its defaults;
* ``gr-5``: gossiprouter driven over the JGroups 5.x protocol (``gossiprouter.protocol.jgroups5``).

and the light-load floor (issue 30), in every run unless ``--routers`` leaves it out:

* ``floor``: ``benchmarks/floor/relay.c``, a minimal single-threaded C epoll relay of the native
  framing (preamble, HELLO/WELCOME, CONNECT/OK, ROUTE forwarded byte for byte, nothing else),
  compiled with the system ``cc`` into ``build/`` on first use (``benchmarks/floor/build.py``)
  and driven over the native protocol by the same Blaster loaders, the same frames as
  ``gr-native``. What any relay pays per message in wake-ups and system calls: the
  ``gr ... / C floor`` columns are gossiprouter's distance to it. It answers no GET_MEMBERS, so
  its idle-case registrations are checked only by the loaders (each waits for its OK).
* ``floor-threads``: ``benchmarks/floor/threads.c``, the same frames and the same work per frame
  as ``floor``, but served as Java 5.x serves them: a blocked reader thread per connection,
  which sends each frame at once to its receivers. Beside ``floor`` it shows what that
  threading alone does to latency and CPU at light load (docs/performance.md).

The load generator is ``benchmarks/jgroups/Blaster.java``, compiled on first use into
``benchmarks/jgroups/classes``. It is protocol-agnostic: this script pre-encodes every byte
sequence (registration, message frames, the router's replies) with the project's codecs
(``gossiprouter.protocol.jgroups2`` and ``native``) and hands them to several Blaster processes.
Senders write pre-encoded frames in large writes (or paced, stamped with
``System.nanoTime()``); receivers count frames (every delivered frame of a case has one known
length) and check a few fixed bytes of each.

Deliveries: a copy of a message that reaches a member other than its sender. A multicast in
the group of 8 therefore makes 7 deliveries with every router. The 2.12 routers (Java, and
gossiprouter speaking 2.12, which is compatible) also send each multicast back to its sender;
those echoes are recognised by a sender-id byte in the payload, counted apart (``echo_per_s``)
and not included in deliveries.

Router CPU per delivered message = the router process's user+system CPU seconds
(``/proc/PID/stat``, all threads) over the measured window ÷ deliveries in that window.

A benchmark, not a test: it prints tables and asserts nothing about speed. Figures are
medians over ``--runs`` runs; the routers alternate run by run so that drift hits all three.

The cases, the protocols' bytes and the loaders' configurations are in vs_jgroups_load.py; the
router and loader processes, and what is read of the machine, in vs_jgroups_procs.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.machine import add_cpu_latency_option, cpu_latency  # noqa: E402
from benchmarks.vs_jgroups_load import (  # noqa: E402
    CASES,
    Case,
    JGroups5,
    JGroups212,
    Native,
    Proto,
    layout,
    loader_configs,
)
from benchmarks.vs_jgroups_procs import (  # noqa: E402
    FLOOR,
    FLOOR_THREADS,
    JAR,
    JAVA_ROUTER_OPTS,
    LOADER_OPTS,
    Loader,
    Router,
    background_load,
    cleanup_on_exit,
    ensure_compiled,
    ensure_floor_built,
    ensure_floor_threads_built,
    jgroups5_version,
    machine_busy_seconds,
    machine_info,
)
from benchmarks.vs_jgroups_tables import (  # noqa: E402
    ALL_ROUTERS,
    FLOORS,
    RATIO_BASE,
    ROUTERS,
    ROUTERS5,
    VARIANT,
    base_kind,
    print_floor_table,
    print_table,
    summarize,
)
from tests.procs import free_port  # noqa: E402

__all__ = ["ALL_ROUTERS", "ROUTERS", "ROUTERS5", "print_floor_table", "print_table", "summarize"]

def proto_for(router: str) -> Proto:
    router = base_kind(router)
    if router in ("java5", "gr-5"):
        return JGroups5()
    return Native() if router in ("gr-native", *FLOORS) else JGroups212()


# --------------------------------------------------------------------------- one run


@dataclass
class RunResult:
    case: str
    router: str
    run: int
    seconds: float
    deliveries_per_s: float
    echo_per_s: float
    sent_per_s: float
    router_cpu_us_per_msg: float
    router_cpu_cores: float
    loader_cpu_cores: float
    machine_busy_cores: float
    other_cpu_cores: float  # everything else the machine ran meanwhile (other workloads)
    p50_us: float | None = None
    p90_us: float | None = None
    p99_us: float | None = None
    p999_us: float | None = None
    max_us: float | None = None
    rss_mib: float | None = None
    router_threads: int | None = None
    registered: int | None = None
    expected_registered: int | None = None
    bad_frames: int = 0
    closed_connections: int = 0
    setup_s: float = 0.0


@dataclass
class Mark:
    t: float
    router_cpu: float
    loader_cpu: float
    busy: float
    recv: int = 0
    echo: int = 0
    sent: int = 0
    bad: int = 0
    closed: int = 0
    hist: dict[int, int] = field(default_factory=dict)


def take_mark(router: Router, loaders: Sequence[Loader]) -> Mark:
    for ld in loaders:
        ld.send("MARK")
    m = Mark(time.monotonic(), router.cpu_seconds(), sum(ld.cpu_seconds() for ld in loaders),
             machine_busy_seconds())
    for ld in loaders:
        line = ld.expect("MARK", 30)
        for word in line.split()[1:]:
            key, _, value = word.partition("=")
            if key == "lat":
                for item in filter(None, value.split(",")):
                    us, _, count = item.partition(":")
                    m.hist[int(us)] = m.hist.get(int(us), 0) + int(count)
            elif key in ("recv", "echo", "sent", "bad", "closed"):
                setattr(m, key, getattr(m, key) + int(value))
    return m


def percentile(hist: dict[int, int], q: float) -> float | None:
    total = sum(hist.values())
    if not total:
        return None
    rank = q * (total - 1)
    seen = 0
    for us in sorted(hist):
        seen += hist[us]
        if seen > rank:
            return float(us)
    return float(max(hist))


def run_one(case: Case, router_kind: str, run: int, seconds: float, warmup: float,
            nloaders: int, tmp: Path, jgroups5: str | None = None,
            gr_args: Sequence[str] = (), tree: Path = REPO) -> RunResult:
    proto = proto_for(router_kind)
    port = free_port()
    t_setup = time.monotonic()
    deadline = 120 + warmup + seconds + case.idle / 100
    configs = loader_configs(case, proto, port, nloaders, deadline)
    tag = f"{case.name}-{router_kind}-{run}"
    router = Router(router_kind, port, tmp / f"router-{tag}.log", jgroups5, gr_args, tree)
    loaders: list[Loader] = []
    try:
        for n, lines in enumerate(configs):
            cfg = tmp / f"loader-{tag}-{n}.cfg"
            cfg.write_text("\n".join(lines) + "\n")
            loaders.append(Loader(cfg, tmp / f"loader-{tag}-{n}.log"))
            if n == 0:
                # The first loader registers its members one by one before anyone else
                # connects: the Java 2.12 router loses registrations when the first CONNECTs
                # to a new group race (get-then-put on its routing table).
                loaders[0].expect("MEMBERS", deadline)
        for ld in loaders:
            ld.expect("READY", deadline)
        setup = time.monotonic() - t_setup
        for ld in loaders:
            ld.send("GO")
        time.sleep(warmup)
        m0 = take_mark(router, loaders)
        time.sleep(seconds)
        m1 = take_mark(router, loaders)
        if not router.alive():
            raise RuntimeError(f"{router_kind} router died during the run")
        dt = m1.t - m0.t
        delivered = m1.recv - m0.recv
        cpu = m1.router_cpu - m0.router_cpu
        res = RunResult(
            case=case.name, router=router_kind, run=run, seconds=dt,
            deliveries_per_s=delivered / dt, echo_per_s=(m1.echo - m0.echo) / dt,
            sent_per_s=(m1.sent - m0.sent) / dt,
            router_cpu_us_per_msg=cpu / delivered * 1e6 if delivered else float("nan"),
            router_cpu_cores=cpu / dt, loader_cpu_cores=(m1.loader_cpu - m0.loader_cpu) / dt,
            machine_busy_cores=(m1.busy - m0.busy) / dt,
            other_cpu_cores=((m1.busy - m0.busy) - cpu - (m1.loader_cpu - m0.loader_cpu)) / dt,
            bad_frames=m1.bad, closed_connections=m1.closed, setup_s=setup,
        )
        if case.rate:
            res.p50_us = percentile(m1.hist, 0.50)
            res.p90_us = percentile(m1.hist, 0.90)
            res.p99_us = percentile(m1.hist, 0.99)
            res.p999_us = percentile(m1.hist, 0.999)
            res.max_us = percentile(m1.hist, 1.0)
        res.rss_mib = router.rss_mib()
        res.router_threads = router.threads()
        if case.kind == "idle" and router_kind not in FLOORS:  # no GET_MEMBERS in a floor
            res.registered = proto.count_members(port)
            res.expected_registered = case.idle + len(layout(case))
        return res
    finally:
        # The router goes first: closing 10,000 registered connections while it runs would make
        # it send SUSPECTs to the whole group for each one, which is not what is measured.
        router.stop()
        for ld in loaders:
            ld.stop()


# --------------------------------------------------------------------------- report


def progress(i: int, total: int, r: RunResult, elapsed: float) -> None:
    extra = ""
    if r.echo_per_s:
        extra += f", echoes {r.echo_per_s:,.0f}/s"
    if r.p99_us is not None:
        extra += (f", latency µs p50 {r.p50_us:,.0f} p90 {r.p90_us or 0:,.0f} "
                  f"p99 {r.p99_us:,.0f} p99.9 {r.p999_us or 0:,.0f} max {r.max_us or 0:,.0f}")
    if r.registered is not None:
        extra += (f", RSS {r.rss_mib:,.1f} MiB, registered {r.registered:,}"
                  f"/{r.expected_registered:,}")
    if r.bad_frames or r.closed_connections:
        extra += f", WARNING bad frames {r.bad_frames}, closed {r.closed_connections}"
    print(f"[{i}/{total} {elapsed:5.0f}s] {r.case} run {r.run} {r.router}: "
          f"{r.deliveries_per_s:,.0f} deliveries/s, {r.router_cpu_us_per_msg:.2f} µs router "
          f"CPU/msg, CPU cores: router {r.router_cpu_cores:.2f}, loaders "
          f"{r.loader_cpu_cores:.2f}, others {r.other_cpu_cores:.2f}{extra} "
          f"(setup {r.setup_s:.1f} s)", flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Benchmark gossiprouter against the Java JGroups 2.12 (and, with --jgroups5, "
                    "5.x) GossipRouter.")
    ap.add_argument("--runs", type=int, default=3, help="runs per case and router (median)")
    ap.add_argument("--seconds", type=float, default=4.0, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=2.0,
                    help="seconds of load before measuring (lets the JVM compile)")
    ap.add_argument("--cases", nargs="+", choices=[c.name for c in CASES],
                    default=[c.name for c in CASES], metavar="CASE",
                    help="cases to run: " + ", ".join(c.name for c in CASES))
    ap.add_argument("--routers", nargs="+", choices=ALL_ROUTERS, default=None,
                    help="routers to run (default: all three, the two C floors, plus java5 and "
                         "gr-5 with --jgroups5)")
    ap.add_argument("--gr-args", default="", metavar="ARGS",
                    help="extra options for every gossiprouter router, e.g. '--no-dispatcher'")
    ap.add_argument("--variant", default="", metavar="ARGS",
                    help="also run every gossiprouter router with these extra options "
                         "(columns marked 'variant'), alternating with the plain ones")
    ap.add_argument("--variant-tree", type=Path, default=None, metavar="DIR",
                    help="run the variant's gossiprouter from this source tree (e.g. an older "
                         "commit unpacked with git archive), with --variant's options if any")
    ap.add_argument("--jgroups5", metavar="CLASSPATH",
                    help="a local JGroups 5.x build (jar or classes directory, ':'-separated): "
                         "adds the Java 5.x GossipRouter (java5) and gossiprouter over the 5.x "
                         "protocol (gr-5)")
    ap.add_argument("--loaders", type=int, default=2, help="load generator processes")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 run, 1 s per case, idle cases with a tenth of the "
                         "connections")
    add_cpu_latency_option(ap)
    ap.add_argument("--json", type=Path, help="also write the runs and medians here")
    ap.add_argument("--logs", type=Path,
                    help="keep router and loader logs and loader configs in this directory")
    args = ap.parse_args(argv)
    if args.quick:
        args.runs, args.seconds, args.warmup = 1, 1.0, 0.5
    if args.runs < 1 or args.seconds <= 0 or args.loaders < 1 or args.warmup < 0:
        ap.error("--runs and --loaders must be >= 1, --seconds > 0, --warmup >= 0")
    if args.variant_tree is not None:
        if not (args.variant_tree / "gossiprouter" / "__main__.py").is_file():
            ap.error(f"--variant-tree: no gossiprouter package in {args.variant_tree}")
        args.variant_tree = args.variant_tree.resolve()
    else:
        args.variant_tree = REPO
    if args.routers is None:
        args.routers = [*ROUTERS, *(ROUTERS5 if args.jgroups5 else ()), *FLOORS]
    if "java5" in args.routers and not args.jgroups5:
        ap.error("the java5 router needs --jgroups5 CLASSPATH (a local JGroups 5.x build)")
    if args.jgroups5:
        missing = [p for p in args.jgroups5.split(os.pathsep) if p and not Path(p).exists()]
        if missing:
            ap.error(f"--jgroups5: no such file or directory: {', '.join(missing)}")
    return args


def run_all(cases: Sequence[Case], routers: Sequence[str], args: argparse.Namespace,
            t0: float) -> list[RunResult]:
    """Every run, routers alternating within each case and run number."""
    results: list[RunResult] = []
    total = len(cases) * args.runs * len(routers)
    i = 0
    with tempfile.TemporaryDirectory(prefix="bench-vs-jgroups-") as tmpdir:
        tmp = Path(tmpdir)
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            tmp = args.logs
        for case in cases:
            for run in range(1, args.runs + 1):
                for r in routers:
                    i += 1
                    variant = r.endswith(VARIANT)
                    try:
                        res = run_one(case, r, run, args.seconds, args.warmup, args.loaders, tmp,
                                      args.jgroups5,
                                      args.gr_args.split() + (args.variant.split()
                                                              if variant else []),
                                      args.variant_tree if variant else REPO)
                    except (RuntimeError, TimeoutError, OSError) as e:
                        print(f"[{i}/{total}] {case.name} run {run} {r}: FAILED: {e}",
                              flush=True)
                        _dump_logs(tmp, f"{case.name}-{r}-{run}")
                        continue
                    results.append(res)
                    progress(i, total, res, time.monotonic() - t0)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cases = [c for c in CASES if c.name in args.cases]
    if args.quick:
        cases = [Case(f"idle-{c.idle // 10}", c.kind, c.size, c.rate, c.idle // 10)
                 if c.kind == "idle" else c for c in cases]
    routers: list[str] = []
    for r in ALL_ROUTERS:
        if r in args.routers:
            routers.append(r)
            if (args.variant or args.variant_tree != REPO) and r in RATIO_BASE:
                routers.append(r + VARIANT)
    if "java" in routers and not JAR.exists():
        print(f"no {JAR}: install libjgroups-java (scripts/setup does)", file=sys.stderr)
        return 1
    if "java5" in routers:
        version = jgroups5_version(args.jgroups5)
        if version is None:
            print(f"--jgroups5 {args.jgroups5}: no JGroups 5.x there "
                  "(org.jgroups.Version did not report a 5.x version)", file=sys.stderr)
            return 1
        print(f"JGroups 5.x router: {version} from {args.jgroups5}", flush=True)
    ensure_compiled()
    if FLOOR in routers:
        print(f"C floor: {ensure_floor_built().relative_to(REPO)}", flush=True)
    if FLOOR_THREADS in routers:
        print(f"C floor, threads: {ensure_floor_threads_built().relative_to(REPO)}", flush=True)
    info = machine_info()
    total = len(cases) * args.runs * len(routers)
    if args.cpu_latency_us is not None:
        info["cpu_latency_us"] = str(args.cpu_latency_us)
    print(f"bench-vs-jgroups: {info['cores']} cores ({info['cpu']}), {info['ram']} RAM, "
          f"{info['java']}, Python {info['python']}, CPU idle {info['cpuidle']}"
          + (f" held at {args.cpu_latency_us} µs" if args.cpu_latency_us is not None else ""),
          flush=True)
    print(f"{len(cases)} cases x {args.runs} runs x {len(routers)} routers = {total} runs, "
          f"{args.warmup:g} s warm-up + {args.seconds:g} s measured each, "
          f"{args.loaders} loader processes", flush=True)
    background = background_load()
    print(f"background CPU load before starting: {background:.2f} cores", flush=True)
    if background > 0.25:
        print("warning: something else is using the CPU; every figure will be skewed "
              "(see the others column of the progress lines)", flush=True)
    t0 = time.monotonic()
    try:
        with cleanup_on_exit(), cpu_latency(args.cpu_latency_us):
            results = run_all(cases, routers, args, t0)
    except KeyboardInterrupt:
        print("\ninterrupted; routers and loaders stopped", file=sys.stderr)
        return 130
    summary = summarize(cases, routers, results)
    print()
    print(f"Medians of {args.runs} run(s); {args.seconds:g} s measured per run after "
          f"{args.warmup:g} s warm-up; total {time.monotonic() - t0:.0f} s.")
    print("Deliveries count copies reaching members other than the sender; 2.12 echoes of a "
          "multicast to its sender are excluded (see echo_per_s in the JSON).")
    print()
    print_table(cases, routers, summary)
    print_floor_table(cases, routers, summary)
    if args.json:
        args.json.write_text(json.dumps({
            "machine": info,
            "background_cpu_cores": background,
            "settings": {"runs": args.runs, "seconds": args.seconds, "warmup": args.warmup,
                         "loaders": args.loaders, "routers": routers,
                         "cases": [asdict(c) for c in cases],
                         "java_router_opts": list(JAVA_ROUTER_OPTS),
                         "loader_opts": list(LOADER_OPTS), "jgroups5": args.jgroups5,
                         "gr_args": args.gr_args, "variant": args.variant,
                         "variant_tree": str(args.variant_tree)},
            "medians": summary,
            "runs": [asdict(r) for r in results],
        }, indent=2))
        print(f"\nwrote {args.json}")
    return 0


def _dump_logs(tmp: Path, tag: str) -> None:
    for log in sorted(tmp.glob(f"*{tag}*.log")):
        text = log.read_text(errors="replace").strip()
        if text:
            tail = "\n    ".join(text.splitlines()[-8:])
            print(f"  {log.name}:\n    {tail}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
