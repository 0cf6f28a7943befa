"""Topic multicast benchmarks: matching cost, and fan-out against mosquitto.

1. **Matching** (in process, no sockets): µs per publish against the number of
   subscriptions in the group (1, 1,000, 100,000 mixed patterns: exact, ``+``,
   trailing ``*``, over 1,000 providers), for one publication id that always
   matches the same 10 members. The index (``TopicIndex.match``) is compared
   with a scan of every subscription (``topics.matches``), measured in the same run:
   the index's cost follows the matches, the scan's the subscriptions.

2. **Fan-out**: 1 publisher -> ``--subscribers`` subscribers (default 1,000),
   ``--size``-byte payloads (default 100), through

   * ``gossiprouter``: ``python -m gossiprouter serve`` on 127.0.0.1, native PUBLISH;
   * ``mosquitto``: Debian's broker on 127.0.0.1 (MQTT 3.1.1, QoS 0, one topic).

   The same loader drives both, in this process: one non-blocking socket per
   subscriber on one epoll selector, counting received bytes (every delivery of
   a run has one known length, taken from the first one); the publisher sends a
   window of messages and the next when the deliveries of the earlier ones have
   arrived, so neither server drops anything. Handshakes use the project's codec
   and paho-mqtt respectively; after them the loader only reads bytes.
   The figure is deliveries per second of **server CPU** (user + system of the
   server process, /proc/PID/stat), i.e. deliveries/s per core, and the ratio
   gossiprouter / mosquitto. Wall-clock rates are printed too, but on a shared
   machine the loader (Python) is usually the bottleneck, so CPU is the fair measure.

A benchmark, not a test: it prints tables and asserts nothing. Run:
``.venv/bin/python benchmarks/bench_topics.py [--subscribers 1000 --messages 2000]``.
"""

from __future__ import annotations

import argparse
import random
import select
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gossiprouter.core.topics import TopicId, TopicIndex, matches, pattern, topic_id  # noqa: E402
from gossiprouter.protocol import native as wire  # noqa: E402
from tests.procs import free_port, proc_cpu_seconds, wait_listening  # noqa: E402

MOSQUITTO = "/usr/sbin/mosquitto"

# --------------------------------------------------------------------------- 1. matching


def mixed_patterns(n: int, rnd: random.Random) -> list[TopicId]:
    """``n`` patterns over 1,000 providers: exact, '+' and trailing '*' mixed."""
    regions = ["eu", "us", "ap", "sa", "af"]
    out: list[TopicId] = []
    for i in range(n):
        prov = f"vehicle-{rnd.randrange(1000)}"
        kind = i % 4
        r = rnd.choice(regions)
        city = f"c{rnd.randrange(100)}"
        if kind == 0:
            out.append(pattern(prov, "position", (r, "de", city)))
        elif kind == 1:
            out.append(pattern(prov, "position", (r, "+", city)))
        elif kind == 2:
            out.append(pattern(prov, "position", (r, "*")))
        else:
            out.append(pattern("+", "speed", (r, "+", city)))
    return out


def bench_matching(sizes: list[int], matching: int = 10) -> None:
    print(f"\n1. Matching: µs per publish (one id matching {matching} members) "
          "against subscriptions in the group")
    print(f"{'subscriptions':>14} {'index µs':>10} {'scan µs':>10} {'matched':>8}")
    tid = topic_id("vehicle-target", "position", ("eu", "de", "munich"))
    hits = [pattern("vehicle-target", "position", ("eu", "de", "munich")),
            pattern("vehicle-target", "position", ("eu", "+", "munich")),
            pattern("vehicle-target", "position", ("eu", "*")),
            pattern("vehicle-target", "position", ("*",)),
            pattern("+", "position", ("eu", "de", "+"))]
    for n in sizes:
        rnd = random.Random(n)
        idx: TopicIndex[int] = TopicIndex()
        subs: list[tuple[int, TopicId]] = []
        for m in range(matching):
            subs.append((m, hits[m % len(hits)]))
        for i, p in enumerate(mixed_patterns(max(0, n - matching), rnd)):
            subs.append((matching + i, p))
        subs = subs[:n] if n < matching else subs
        for m, p in subs:
            idx.subscribe(m, p)
        expected = {m for m, p in subs if matches(p, tid)}
        assert idx.match(tid) == expected
        reps = max(50, 200_000 // max(n, 1))
        t0 = time.perf_counter()
        for _ in range(reps):
            idx.match(tid)
        t_idx = (time.perf_counter() - t0) / reps * 1e6
        scan_reps = max(3, 20_000 // max(n, 1))
        t0 = time.perf_counter()
        for _ in range(scan_reps):
            {m for m, p in subs if matches(p, tid)}
        t_scan = (time.perf_counter() - t0) / scan_reps * 1e6
        print(f"{n:>14,} {t_idx:>10.2f} {t_scan:>10.1f} {len(expected):>8}")


# --------------------------------------------------------------------------- 2. fan-out


class Loader:
    """Subscriber sockets on one selector, counting received bytes."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.socks: list[socket.socket] = []
        self.received = 0
        self.buf = bytearray(1 << 20)

    def add(self, s: socket.socket) -> None:
        s.setblocking(False)
        self.sel.register(s, selectors.EVENT_READ)
        self.socks.append(s)

    def pump(self, timeout: float) -> int:
        """Read whatever is ready (waiting up to ``timeout``); bytes read."""
        n = 0
        for key, _ in self.sel.select(timeout):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            try:
                while True:
                    k = s.recv_into(self.buf)
                    if not k:
                        raise RuntimeError("server closed a subscriber connection")
                    n += k
                    if k < len(self.buf):
                        break
            except BlockingIOError:
                pass
        self.received += n
        return n

    def close(self) -> None:
        for s in self.socks:
            self.sel.unregister(s)
            s.close()
        self.sel.close()


def run_fanout(name: str, pid: int | Sequence[int], loader: Loader,
               publish: Callable[[int], None], messages: int, subscribers: int,
               window: int) -> dict[str, float]:
    """Publish ``messages`` (at most ``window`` not yet delivered everywhere) and count the
    deliveries; ``cpu_s`` is the CPU time of the server process ``pid`` (or of all of them:
    two federated routers, say) over the measured part."""
    pids = [pid] if isinstance(pid, int) else list(pid)
    # Warm-up: one message, to learn one delivery's size on this server.
    publish(1)
    deadline = time.monotonic() + 10
    while loader.received < subscribers and time.monotonic() < deadline:
        loader.pump(0.1)
    time.sleep(0.2)
    loader.pump(0)
    if loader.received % subscribers:
        raise RuntimeError(f"{name}: warm-up delivered {loader.received} bytes to "
                           f"{subscribers} subscribers")
    size = loader.received // subscribers
    loader.received = 0
    total = messages * subscribers * size
    cpu0, t0 = sum(map(proc_cpu_seconds, pids)), time.perf_counter()
    sent = 0
    deadline = time.monotonic() + 120
    while loader.received < total:
        done = loader.received // (subscribers * size)
        if sent < messages and sent - done < window:
            k = min(window - (sent - done), messages - sent)
            publish(k)
            sent += k
        loader.pump(0.05)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: only {loader.received / size:.0f} of "
                               f"{messages * subscribers} deliveries within 120 s")
    wall = time.perf_counter() - t0
    cpu = sum(map(proc_cpu_seconds, pids)) - cpu0
    if loader.received != total:
        raise RuntimeError(f"{name}: {loader.received} bytes, expected {total}")
    deliveries = messages * subscribers
    return {"deliveries": deliveries, "wall_s": wall, "cpu_s": cpu, "size": size,
            "per_s": deliveries / wall, "per_cpu_s": deliveries / max(cpu, 1e-9)}


def _recv_frames(s: socket.socket, dec: wire.Decoder, n: int) -> list[wire.Frame]:
    out: list[wire.Frame] = []
    s.settimeout(10)
    while len(out) < n:
        f = dec.next_frame()
        if f is not None:
            out.append(f)
            continue
        data = s.recv(65536)
        if not data:
            raise RuntimeError("router closed the connection")
        dec.feed(data)
    return out


def _native_member(port: int, addr: bytes, subscribe: bool) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    frames: list[wire.Frame] = [wire.Hello((1,), "bench", None), wire.Connect(1, "bench", addr)]
    if subscribe:
        frames.append(wire.Subscribe(2, "bench", addr, "vehicle-17", "position", ("eu", "*")))
    s.sendall(wire.PREAMBLE + b"".join(wire.encode(f) for f in frames))
    for f in _recv_frames(s, wire.Decoder(), len(frames)):
        if isinstance(f, wire.Error):
            raise RuntimeError(f"router refused: {f.code}: {f.message}")
    return s


def fanout_gossiprouter(subscribers: int, messages: int, size: int,
                        window: int) -> dict[str, float]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gossiprouter", "serve", "--host", "127.0.0.1", "--port",
         str(port), "--log-level", "warning", "--max-connections", str(subscribers + 100),
         "--idle-timeout", "0"], cwd=REPO)
    loader = Loader()
    try:
        wait_listening(port, proc)
        for i in range(subscribers):
            loader.add(_native_member(port, b"s%d" % i, subscribe=True))
        pub = _native_member(port, b"P", subscribe=False)
        frame = wire.encode_publish("bench", b"P", "vehicle-17", "position",
                                    ("eu", "de", "munich"), 0, bytes(size))

        def publish(k: int) -> None:
            pub.sendall(frame * k)

        return run_fanout("gossiprouter", proc.pid, loader, publish, messages, subscribers,
                          window)
    finally:
        loader.close()
        proc.terminate()
        proc.wait(10)


def _drive(c: Any, done: Callable[[], bool], what: str) -> None:
    """Run paho's I/O until ``done()``: poll, not paho's loop() (select() fails above fd 1024)."""
    sock = c.socket()
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    deadline = time.monotonic() + 10
    while not done():
        while c.want_write():
            c.loop_write()
        if poller.poll(100):
            c.loop_read()
        if time.monotonic() > deadline:
            raise RuntimeError(f"mosquitto did not answer {what}")


def fanout_mosquitto(subscribers: int, messages: int, size: int,
                     window: int) -> dict[str, float]:
    from paho.mqtt.client import Client
    from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="bench-mosquitto-"))
    conf = tmp / "mosquitto.conf"
    # No per-client queue bound gets in the way: the loader's window bounds what is in flight.
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                    "max_queued_messages 0\nlog_type error\n")
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    loader = Loader()
    clients: list[Client] = []
    topic = "vehicle-17/position/eu/de/munich"
    try:
        wait_listening(port, proc)
        for i in range(subscribers):
            c = Client(CallbackAPIVersion.VERSION2, client_id=f"s{i}",
                       protocol=MQTTProtocolVersion.MQTTv311)
            acked: list[bool] = []

            def on_subscribe(*a: Any, acked: list[bool] = acked) -> None:
                acked.append(True)

            c.on_subscribe = on_subscribe
            c.connect("127.0.0.1", port, keepalive=600)
            c.subscribe("vehicle-17/position/eu/#", qos=0)
            _drive(c, partial(bool, acked), f"SUBSCRIBE {i}")
            sock = c.socket()
            assert isinstance(sock, socket.socket)
            clients.append(c)  # keep it referenced; from here on the loader reads its socket
            loader.add(sock)
        pub = Client(CallbackAPIVersion.VERSION2, client_id="pub",
                     protocol=MQTTProtocolVersion.MQTTv311)
        pub.connect("127.0.0.1", port, keepalive=600)
        _drive(pub, pub.is_connected, "publisher CONNECT")
        clients.append(pub)
        payload = bytes(size)

        def publish(k: int) -> None:
            for _ in range(k):
                pub.publish(topic, payload, qos=0)
            while pub.want_write():
                pub.loop_write()

        return run_fanout("mosquitto", proc.pid, loader, publish, messages, subscribers,
                          window)
    finally:
        loader.close()
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subscribers", type=int, default=1000)
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--window", type=int, default=20,
                    help="messages in flight (not yet delivered to every subscriber)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--skip-matching", action="store_true")
    ap.add_argument("--skip-fanout", action="store_true")
    args = ap.parse_args()
    if not args.skip_matching:
        bench_matching([1, 1_000, 100_000])
    if args.skip_fanout:
        return
    print(f"\n2. Fan-out: 1 publisher -> {args.subscribers} subscribers, {args.size} B payload, "
          f"{args.messages} messages, window {args.window}")
    print(f"{'server':<14} {'deliveries':>11} {'wall s':>7} {'cpu s':>7} {'bytes':>6} "
          f"{'deliv/s':>10} {'deliv/cpu-s':>12}")
    results: dict[str, list[dict[str, float]]] = {"gossiprouter": [], "mosquitto": []}
    for _ in range(args.runs):
        for name, fn in (("gossiprouter", fanout_gossiprouter),
                         ("mosquitto", fanout_mosquitto)):
            r = fn(args.subscribers, args.messages, args.size, args.window)
            results[name].append(r)
            print(f"{name:<14} {r['deliveries']:>11,.0f} {r['wall_s']:>7.2f} {r['cpu_s']:>7.2f} "
                  f"{r['size']:>6.0f} {r['per_s']:>10,.0f} {r['per_cpu_s']:>12,.0f}")
    best = {k: max(r["per_cpu_s"] for r in v) for k, v in results.items()}
    print(f"\nratio gossiprouter / mosquitto, deliveries per server CPU second: "
          f"{best['gossiprouter'] / best['mosquitto']:.2f}x (best of {args.runs} run(s) each)")


if __name__ == "__main__":
    main()
