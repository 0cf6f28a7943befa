"""The floor of a route across routers (issue 30): bench_federation's interleaved traffic
through gossiprouter and through a minimal C relay, each alone and three of them federated
through one mosquitto, in the same run.

    .venv/bin/python benchmarks/bench_federation_floor.py [--rounds 3] [--mix 4000]

The C relay is ``benchmarks/floor/relay.c`` (built into ``build/`` on first use): alone, the
light-load floor of ``scripts/bench-vs-jgroups``; federated (``floor-relay PORT BROKER_PORT
ID``), one connection to the broker, a member list from retained messages, and what one
wake-up routes to a relay sent as one QoS 0 PUBLISH, the frames byte for byte. It checks,
signs and counts nothing: it is what any relay pays for a route through a broker (the system
calls, the wake-ups of four processes, mosquitto), not a router.

Each round runs the four cases in turn (gossiprouter alone, gossiprouter across 3 routers,
the C relay alone, the C relay across 3): ``--mix`` messages at ``--rate`` a second, one a
tick, from a member of the first router to 5 receivers (1 on that router, 2 on each other;
all 5 on the one router alone), every sixth message a multicast. Printed: p50 and p99 at the
receivers on other routers (alone: at every receiver), the CPU per message of every process
(user + system, and the system part), and the ratios of each implementation across routers
to gossiprouter alone: issue 30's target is 5x.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_federation import BROKER, RECEIVING, ROUTER_ARGS, SENDING  # noqa: E402
from benchmarks.federation_mix import MixOut, run_mix  # noqa: E402
from benchmarks.figures import percentile  # noqa: E402
from benchmarks.floor.build import built  # noqa: E402
from tests.procs import BrokerProcess, RouterProcess  # noqa: E402

__all__ = ["BROKER", "C_FAR", "C_ONE", "GR_FAR", "GR_ONE", "RECEIVING", "SENDING", "run", "table"]

GR_ONE, GR_FAR = "gossiprouter: one router", "gossiprouter: across 3 routers (mosquitto)"
C_ONE, C_FAR = "C relay: one relay", "C relay: across 3 relays (mosquitto)"


class FloorRelay(RouterProcess):
    """``floor-relay PORT [BROKER_PORT ID]`` on 127.0.0.1, started and stopped as a router."""

    def __init__(self, binary: Path, broker_port: int | None = None, relay_id: int = 0) -> None:
        super().__init__(None)
        self.binary = binary
        self.federated = () if broker_port is None else (str(broker_port), str(relay_id))

    def command(self) -> list[str]:
        return [str(self.binary), str(self.port), *self.federated]


def run(rounds: int, messages: int, rate: float, wait: float,
        say: Callable[[str], None] = print) -> dict[str, MixOut]:
    """Start mosquitto, the routers and the relays; run every case ``rounds`` times in turn;
    stop them. The results by case."""
    binary = built()
    tmp = Path(tempfile.mkdtemp(prefix="bench-federation-floor-"))
    out: dict[str, MixOut] = {}
    broker = BrokerProcess(tmp)
    # As bench_federation: without it mosquitto holds a small message back (Nagle).
    broker.conf.write_text(broker.conf.read_text() + "set_tcp_nodelay true\n")
    with broker:  # (starts it)
        gr_one = RouterProcess(None, *ROUTER_ARGS)
        gr_far = [RouterProcess(None, *ROUTER_ARGS, "--bridge", broker.url,
                                "--bridge-reconnect-max", "0.5", "--router-id", f"r{i}")
                  for i in range(3)]
        c_one = FloorRelay(binary)
        c_far = [FloorRelay(binary, broker.port, i) for i in range(3)]
        started: list[RouterProcess] = []
        try:
            for r in (gr_one, *gr_far, c_one, *c_far):
                started.append(r.start())
            cases = []
            for name, one, far in ((GR_ONE, gr_one, None), (GR_FAR, None, gr_far),
                                   (C_ONE, c_one, None), (C_FAR, None, c_far)):
                if one is not None:
                    cases.append((name, one.port, [(one.port, "local")] * 5, [one.pid],
                                  [SENDING]))
                else:
                    assert far is not None
                    a, b, c = (r.port for r in far)
                    rx = [(a, "local"), (b, "remote"), (b, "remote"), (c, "remote"),
                          (c, "remote")]
                    cases.append((name, a, rx, [*(r.pid for r in far), broker.pid],
                                  [SENDING, RECEIVING, RECEIVING, BROKER]))
            for rnd in range(rounds):
                for k, (name, tx, rx, pids, roles) in enumerate(cases):
                    say(f"round {rnd + 1}/{rounds}: {name}: {messages} messages")
                    m = run_mix(f"floor-{rnd}-{k}", tx, rx, messages, rate, pids, wait, 1,
                                roles)
                    if m is None:
                        raise SystemExit(f"{name}: a receiver was not reachable within "
                                         f"{wait} s (membership not federated)")
                    out.setdefault(name, MixOut()).add(m)
        finally:
            for p in started:
                p.stop()
    return out


def table(res: dict[str, MixOut], out: Callable[[str], None] = print) -> None:
    """The cases, their CPU split by process, and the ratios against gossiprouter alone."""
    out(f"{'case':<44} {'p50 µs':>8} {'p99 µs':>8} {'sending':>12} {'each rx':>12} "
        f"{'broker':>12} {'all':>13}")
    out(f"{'(CPU µs per message, of it system time)':<44}")
    cpu: dict[str, float] = {}
    for name, m in res.items():
        lat = m.lat.get("remote") or m.lat.get("local", [])
        cpu[name] = m.cpu_s / max(m.messages, 1) * 1e6
        missing = "" if m.delivered == m.expected else \
            f"  ({m.expected - m.delivered} of {m.expected} deliveries missing)"
        p50, p99 = (f"{percentile(lat, q) * 1e6:,.0f}" if lat else "-" for q in (0.5, 0.99))
        out(f"{name:<44} {p50:>8} {p99:>8} {m.per_message_us(SENDING):>12} "
            f"{m.per_message_us(RECEIVING):>12} {m.per_message_us(BROKER):>12} "
            f"{m.per_message_us():>13}{missing}")
    base = cpu.get(GR_ONE)
    if not base:
        out("- (gossiprouter alone below /proc's 10 ms tick: more --mix)")
        return
    for name, what in ((GR_FAR, "gossiprouter across routers"),
                       (C_FAR, "the C relay across relays"),
                       (C_ONE, "the C relay alone")):
        if name in cpu:
            out(f"CPU per message, {what} / gossiprouter alone: {cpu[name] / base:.1f}x"
                + (" (target <= 5)" if name != C_ONE else ""))
    if cpu.get(C_ONE) and C_FAR in cpu:
        out(f"CPU per message, the C relay across relays / the C relay alone: "
            f"{cpu[C_FAR] / cpu[C_ONE]:.1f}x")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of the four cases, taking turns (default 3)")
    ap.add_argument("--mix", type=int, default=4000,
                    help="messages per case and round (default 4000)")
    ap.add_argument("--rate", type=float, default=1000.0,
                    help="messages per second, one a tick (default 1000)")
    ap.add_argument("--wait", type=float, default=5.0,
                    help="seconds to wait for a remote member to be reachable (default 5)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.mix < 6 or args.rate <= 0:
        ap.error("--rounds must be at least 1, --mix at least 6 and --rate above 0")
    table(run(args.rounds, args.mix, args.rate, args.wait))


if __name__ == "__main__":
    main()
