"""Mutation fuzzer for the router (``scripts/fuzz``): hostile inputs on all three protocols
while honest members exchange sequenced messages.

A real router subprocess is started on 127.0.0.1 (default settings, or with a tokens file with
``--auth``). A second process runs honest members, two per protocol (native, JGroups 2.12,
JGroups 5.x), each pair exchanging sequenced unicasts and multicasts, the native and 5.x ones
also asking for their group's members now and then, as real members do. Meanwhile this
process builds (benchmarks/fuzz_inputs.py) *valid* frames with the project's codecs
(``gossiprouter.protocol``), with
hostile values (huge, NUL-heavy, non-BMP, control-character names; raw NUL bytes that
re-encode longer; group names at the writeUTF limit) and then mutates them: bit flips,
byte insertions and deletions, truncation, length prefixes that lie, pipelined floods of one
frame, partial frames left open, segment-by-segment writes. Each input goes to a fresh or a
reused connection, and what the router answers is read and discarded.

Inputs come from ``random.Random(seed)``: the same ``--seed`` replays the same inputs, and a
crash report names the input's number. Hypothesis is not used here: its engine shrinks
failures by re-running inputs, which a stateful router behind a socket does not allow.

At the end it prints inputs tried, crashes (the router exited, or wrote a traceback to its
log), router RSS before / peak / after, and honest messages lost; it exits 1 if the router
crashed, an honest message was lost or an honest member lost its connection.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import re
import select
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.fuzz_inputs import PROTOCOLS, Input, corpus, make_input  # noqa: E402
from gossiprouter.protocol import jgroups2 as j2  # noqa: E402
from gossiprouter.protocol import jgroups5 as j5  # noqa: E402
from gossiprouter.protocol import native as wire  # noqa: E402
from gossiprouter.protocol.jgroups_address import V2, V5, JAddress  # noqa: E402
from tests.procs import RouterProcess  # noqa: E402

TOKEN = "fuzz-token-0123456789abcdef"
HONEST_RATE = 100.0  # messages per second per honest member
HONEST_DRAIN = 10.0  # seconds the honest receivers get to see the last messages
MAX_OPEN = 24  # connections the fuzzer keeps open at once (partial frames, reuse)
_I32 = struct.Struct(">i")
_HDR = struct.Struct(">cBq")  # honest payload: b"H", member id, seq


# --------------------------------------------------------------------------- honest members


@dataclass
class HonestResult:
    sent: dict[str, int] = field(default_factory=dict)
    received: dict[str, set[int]] = field(default_factory=dict)  # "sender>receiver" -> seqs
    errors: list[str] = field(default_factory=list)
    # The receiver-side framing check: bytes an honest member received that are not whole
    # frames of its protocol (a frame inside another, a stream ending inside one).
    framing: list[str] = field(default_factory=list)

    def lost(self) -> dict[str, int]:
        """Per (sender>receiver): messages sent by the sender the receiver never got."""
        out: dict[str, int] = {}
        for key, seqs in self.received.items():
            sender = key.split(">")[0]
            missing = self.sent.get(sender, 0) - len(seqs)
            if missing:
                out[key] = missing
        return out


class _Member:
    """One honest member: a blocking socket, a sender loop and a receiver thread."""

    def __init__(self, proto: str, ident: int, port: int, group: str, token: str | None,
                 result: HonestResult, lock: threading.Lock) -> None:
        self.proto, self.ident, self.port, self.group = proto, ident, port, group
        self.token = token
        self.result, self.lock = result, lock
        self.name = f"{proto}-{ident}"
        self.peer: _Member | None = None
        self.seq = 0
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Honest addresses come from their own space: the fuzzer's addresses never collide.
        if proto == "native":
            self.addr: Any = b"honest-%d" % ident
        else:
            self.addr = JAddress.from_uuid(0x4F4E455354000000 + ident, 0x484F4E4553540000 + ident,
                                           version=V2 if proto == "jgroups2" else V5)
        self._frames: list[object] = []  # what the router sent besides messages

    # -- join -------------------------------------------------------------------------------

    def _read_until(self, done: Callable[[], bool]) -> None:
        while not done():
            data = self.sock.recv(65536)
            if not data:
                raise EOFError(f"{self.name}: router closed the connection while joining")
            self._feed(data)

    def join(self) -> None:
        if self.proto == "native":
            self.dec_n = wire.Decoder(max_frame=64 << 20)
            self.sock.sendall(wire.PREAMBLE + wire.encode(wire.Hello((1,), "honest", self.token)))
            self.sock.sendall(wire.encode(wire.Connect(1, self.group, self.addr, self.name, ())))
            self._read_until(lambda: any(isinstance(f, wire.Ok) for f in self._frames))
        elif self.proto == "jgroups2":
            self.dec_2 = j2.ClientDecoder(max_frame=64 << 20)
            self.dec_2.expect_connect_reply()
            self.sock.sendall(j2.connect(self.group, self.addr, self.name, []))
            self._read_until(lambda: any(isinstance(e, j2.ConnectReply) for e in self._frames))
        else:
            self.dec_5 = j5.Decoder(max_frame=64 << 20)
            self.sock.sendall(j5.register(self.group, self.addr, self.name, None))
            self.sock.sendall(j5.heartbeat())
            self._read_until(lambda: any(isinstance(e, j5.Heartbeat) for e in self._frames))
        self._frames.clear()

    # -- receive ----------------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        if self.proto == "native":
            self.dec_n.feed(data)
            while (f := self.dec_n.next_frame()) is not None:
                if isinstance(f, wire.Route):
                    self._got(f.payload)
                else:
                    self._frames.append(f)
        elif self.proto == "jgroups2":
            self.dec_2.feed(data)
            while (e := self.dec_2.next_event()) is not None:
                if isinstance(e, j2.Message):
                    self._got(e.payload)
                elif isinstance(e, j2.Unknown):  # a type the router never sends
                    self._framing(f"a 2.12 object of unknown type {e.type_byte}")
                else:
                    self._frames.append(e)
        else:
            self.dec_5.feed(data)
            while (e5 := self.dec_5.next_event()) is not None:
                if isinstance(e5, j5.Message):
                    self._got(e5.payload)
                elif isinstance(e5, j5.Malformed):  # the decoder skips it: the check does not
                    self._framing(f"a 5.x frame that does not parse ({e5})")
                else:
                    self._frames.append(e5)

    def _got(self, payload: bytes) -> None:
        try:
            tag, sender, seq = _HDR.unpack_from(payload)
        except struct.error:
            return
        if tag != b"H" or sender == self.ident:
            return  # not an honest message, or our own multicast echoed
        with self.lock:
            self.result.received.setdefault(
                f"{self.proto}-{sender}>{self.name}", set()).add(seq)

    def receive_loop(self, stop_at: list[float]) -> None:
        self.sock.settimeout(0.5)
        while time.monotonic() < stop_at[0]:
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError as e:
                self._error(f"receive: {type(e).__name__}: {e}")
                return
            if not data:
                self._error("the router closed the connection")
                return
            try:
                self._feed(data)
            except Exception as e:  # a reply the honest client cannot read is a finding
                self._framing(f"undecodable data from the router: {type(e).__name__}: {e}")
                self._error(f"undecodable data from the router: {type(e).__name__}: {e}")
                return
            self._frames.clear()
        # The drain is over: the stream must end on a frame boundary (what is still in flight
        # gets a few seconds to arrive).
        self.sock.settimeout(3.0)
        while left := self._unfinished():
            try:
                data = self.sock.recv(65536)
                self._feed(data)
            except Exception:  # closed, or already counted above
                break
            if not data:
                break
        if left:
            self._framing(f"the stream ends {left} bytes into a frame")

    def _unfinished(self) -> int:
        """Bytes received that do not complete a frame yet."""
        if self.proto == "native":
            return self.dec_n.pending
        return self.dec_2.buffered if self.proto == "jgroups2" else self.dec_5.buffered

    def _framing(self, what: str) -> None:
        with self.lock:
            self.result.framing.append(f"{self.name}: {what}")

    def _error(self, what: str) -> None:
        with self.lock:
            self.result.errors.append(f"{self.name}: {what}")

    # -- send -------------------------------------------------------------------------------

    def send_one(self) -> None:
        assert self.peer is not None
        payload = _HDR.pack(b"H", self.ident, self.seq) + bytes(48)
        multicast = self.seq % 2 == 1
        if self.proto == "native":
            dest = None if multicast else self.peer.addr
            frame = wire.encode_route(self.group, dest, self.addr, payload)
        elif self.proto == "jgroups2":
            frame = j2.message(self.group, None if multicast else self.peer.addr, payload)
        else:
            frame = j5.message(self.group, None if multicast else self.peer.addr, self.addr,
                               payload)
        if self.seq % 50 == 49:
            # A routine member query, as a real member makes now and then (GET_MBRS for 5.x,
            # GET_MEMBERS for native; a 2.12 member asks on a separate connection).
            if self.proto == "native":
                frame += wire.encode(wire.GetMembers(10 + self.seq, self.group))
            elif self.proto == "jgroups5":
                frame += j5.get_members(self.group)
        self.sock.sendall(frame)
        self.seq += 1
        with self.lock:
            self.result.sent[self.name] = self.seq


def _honest(port: int, token: str | None, seconds: float, ready: Any, stop: Any,
            out: Any) -> None:
    """The honest process: six members, sending until ``seconds`` have passed or ``stop``
    is set (the router died: there is no point in going on)."""
    result = HonestResult()
    lock = threading.Lock()
    members: list[_Member] = []
    try:
        for i, proto in enumerate(PROTOCOLS):
            group = f"honest-{proto}"
            a = _Member(proto, 2 * i, port, group, token if proto == "native" else None,
                        result, lock)
            b = _Member(proto, 2 * i + 1, port, group, token if proto == "native" else None,
                        result, lock)
            a.peer, b.peer = b, a
            a.join()
            b.join()
            members += [a, b]
    except (OSError, EOFError) as e:
        result.errors.append(f"joining: {type(e).__name__}: {e}")
        ready.set()
        out.put(result)
        return
    ready.set()
    end = time.monotonic() + seconds
    stop_at = [end + HONEST_DRAIN]
    threads = [threading.Thread(target=m.receive_loop, args=(stop_at,), daemon=True)
               for m in members]
    for t in threads:
        t.start()
    interval = 1.0 / HONEST_RATE
    nxt = time.monotonic()
    broken: set[str] = set()
    while (now := time.monotonic()) < end and not stop.is_set():
        if nxt > now:
            time.sleep(nxt - now)
        nxt += interval
        for m in members:
            if m.name in broken:
                continue
            try:
                m.send_one()
            except OSError as e:
                broken.add(m.name)
                result.errors.append(f"{m.name}: send: {type(e).__name__}: {e}")
    # Wait for the last messages: until every receiver has everything, or the drain ends.
    while (time.monotonic() < stop_at[0] and result.lost()
           and any(t.is_alive() for t in threads)):
        time.sleep(0.1)
    stop_at[0] = 0.0
    for t in threads:
        t.join(2)
    for m in members:
        m.sock.close()
    # Every pair that never received anything at all still counts: make its key exist.
    for m in members:
        assert m.peer is not None
        result.received.setdefault(f"{m.peer.name}>{m.name}", set())
    out.put(result)


# --------------------------------------------------------------------------- driving


def _drain(s: socket.socket, wait: float, cap: int = 8 << 20) -> int:
    """Read what the router answers until ``wait`` seconds of silence, EOF or ``cap`` bytes.

    Waits with select, so that the socket's own timeout (for the writer) does not apply.
    """
    got = 0
    try:
        while got < cap:
            readable, _, _ = select.select([s], [], [], wait)
            if not readable:
                break
            data = s.recv(1 << 20)
            if not data:
                break
            got += len(data)
    except (OSError, ValueError):  # ValueError: closed by the writer meanwhile
        pass
    return got


def send_input(port: int, inp: Input, open_conns: list[socket.socket]) -> None:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        return
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Read while writing, so that a big answer cannot block the router's writes to us
        # and our writes to it at the same time.
        reader = threading.Thread(target=_drain, args=(s, 0.01), daemon=True)
        reader.start()
        s.settimeout(5)
        for i, chunk in enumerate(inp.chunks):
            s.sendall(chunk)
            if inp.pause and i + 1 < len(inp.chunks):
                time.sleep(inp.pause)
        reader.join(5)
    except OSError:
        pass
    if inp.keep_open:
        open_conns.append(s)
        while len(open_conns) > MAX_OPEN:
            open_conns.pop(0).close()
    elif inp.mutation == "valid then reset":
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    else:
        s.close()


class RssSampler:
    def __init__(self, router: RouterProcess) -> None:
        self.router = router
        self.peak = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def read(self) -> int:
        try:
            v = self.router.rss_bytes()
        except (OSError, RuntimeError):
            return 0
        self.peak = max(self.peak, v)
        return v

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            self.read()


# A top-level traceback (plain or exception group); nested ones are prefixed with "|".
_TRACEBACK = re.compile(r"^\s*(\+ )?(Exception Group )?Traceback \(most recent call last\):",
                        re.M)
_EXC_LINE = re.compile(r"^[\w.]+: .+")


@dataclass
class Outcome:
    inputs: int = 0
    bytes_sent: int = 0
    by_proto: dict[str, int] = field(default_factory=dict)
    router_exit: int | None = None
    crash_input: str | None = None
    first_input: str | None = None  # the inputs just before the first traceback
    tracebacks: int = 0
    first_traceback: str = ""
    rss_before: int = 0
    rss_peak: int = 0
    rss_after: int = 0
    honest: HonestResult | None = None

    @property
    def lost(self) -> int:
        if self.honest is None:
            return -1
        return sum(self.honest.lost().values())

    @property
    def crashes(self) -> int:
        """1 if the router exited, else the exceptions it logged with a traceback (each one
        an input that the router did not handle as a protocol error)."""
        return 1 if self.router_exit is not None else self.tracebacks

    def ok(self) -> bool:
        """No crash, and every honest member kept its connection and got every message."""
        return (self.crashes == 0 and self.honest is not None and self.lost == 0
                and not self.honest.errors and not self.honest.framing)


def _log_tracebacks(log: Path) -> tuple[int, str]:
    """How many tracebacks the router's log holds, and the exception line of the first."""
    text = log.read_text(errors="replace") if log.exists() else ""
    found = list(_TRACEBACK.finditer(text))
    if not found:
        return 0, ""
    end = found[1].start() if len(found) > 1 else len(text)
    lines = [ln.strip().lstrip("|+ ").strip() for ln in text[found[0].start():end].splitlines()]
    excs = [ln for ln in lines if _EXC_LINE.match(ln) and not ln.startswith("File ")]
    return len(found), excs[-1] if excs else lines[-1]


def run(seconds: float, seed: int, auth: bool, workdir: Path,
        say: Callable[[str], None] = print) -> Outcome:
    """Run the fuzzer for ``seconds`` against a fresh router; return what happened."""
    out = Outcome()
    log = workdir / "router.log"
    args = ["--log-level", "info"]
    token = None
    if auth:
        tokens = workdir / "tokens.toml"
        tokens.write_text(f'[[token]]\nidentity = "fuzz"\ntoken = "{TOKEN}"\ngroups = ["*"]\n')
        os.chmod(tokens, 0o600)
        args += ["--tokens-file", str(tokens)]
        token = TOKEN
    ctx = mp.get_context("fork")
    rng = random.Random(seed)
    with RouterProcess(None, *args, log=log) as router:
        sampler = RssSampler(router)
        ready, stop = ctx.Event(), ctx.Event()
        results: Any = ctx.Queue()
        honest = ctx.Process(target=_honest,
                             args=(router.port, token, seconds, ready, stop, results))
        honest.start()
        ready.wait(30)
        time.sleep(0.3)
        out.rss_before = sampler.read()
        open_conns: list[socket.socket] = []
        t_end = time.monotonic() + seconds
        last_report = time.monotonic()
        recent: list[str] = []
        log_pos = log.stat().st_size
        queue = corpus(token)
        while time.monotonic() < t_end:
            inp = queue.pop(0) if queue else make_input(rng, token)
            recent = [*recent[-2:], f"#{out.inputs + 1} {inp.describe()}"]
            out.inputs += 1
            out.by_proto[inp.proto] = out.by_proto.get(inp.proto, 0) + 1
            out.bytes_sent += sum(len(c) for c in inp.chunks)
            send_input(router.port, inp, open_conns)
            assert router.proc is not None
            # The router may take a moment to exit after an exception: its log says at once.
            with open(log, "rb") as f:
                f.seek(log_pos)
                fresh = f.read()
            log_pos += len(fresh)
            if out.first_input is None and _TRACEBACK.search(fresh.decode(errors="replace")):
                out.first_input = f"seed {seed}, the last inputs: " + "; ".join(recent)
                say(f"traceback in the router log after input #{out.inputs}")
            if router.proc.poll() is not None:
                out.router_exit = router.proc.returncode
                # The input that killed it may be one of the last few (a registration, then a
                # later member query that has to write the name back).
                out.crash_input = f"seed {seed}, the last inputs: " + "; ".join(recent)
                say(f"ROUTER EXITED with status {out.router_exit} after input #{out.inputs}")
                break
            if time.monotonic() - last_report > 5:
                last_report = time.monotonic()
                say(f"  {out.inputs:,} inputs, router RSS {sampler.read() / 2**20:.0f} MiB")
        stop.set()
        for s in open_conns:
            s.close()
        # Take the result before joining: the honest process cannot exit until the parent has
        # read what it put on the queue (72,000 sequence numbers do not fit the pipe), so
        # joining first waited out the whole join timeout (3 min for a 120 s run).
        try:
            out.honest = results.get(timeout=seconds + HONEST_DRAIN + 60)
        except Exception:
            out.honest = None
        honest.join(10)
        if honest.is_alive():
            honest.kill()
        time.sleep(1.0)
        out.rss_after = sampler.read()
        sampler.stop.set()
        out.rss_peak = sampler.peak
        assert router.proc is not None
        if out.router_exit is None and router.proc.poll() is not None:
            out.router_exit = router.proc.returncode
        if out.router_exit is None and router.stop() != 0:
            out.router_exit = router.proc.returncode
    out.tracebacks, out.first_traceback = _log_tracebacks(log)
    return out


def report(out: Outcome, seconds: float, seed: int, auth: bool) -> str:
    mib = 2**20
    lines = [
        f"fuzz: {seconds:g} s, seed {seed}, router {'with' if auth else 'without'} tokens file",
        f"inputs tried: {out.inputs:,} ("
        + ", ".join(f"{p} {n:,}" for p, n in sorted(out.by_proto.items()))
        + f"), {out.bytes_sent / mib:.1f} MiB sent",
        f"crashes: {out.crashes} (router exit: "
        f"{'none' if out.router_exit is None else f'status {out.router_exit}'}; "
        f"tracebacks in its log: {out.tracebacks})",
        f"router RSS: before {out.rss_before / mib:.0f} MiB, peak {out.rss_peak / mib:.0f} MiB, "
        f"after {out.rss_after / mib:.0f} MiB",
    ]
    if out.honest is None:
        lines.append("honest messages lost: unknown (the honest members did not report)")
    else:
        sent = sum(out.honest.sent.values())
        lines.append(f"honest messages lost: {out.lost:,} of {sent:,} sent"
                     + (f" ({', '.join(f'{k} {v}' for k, v in sorted(out.honest.lost().items()))})"
                        if out.lost else ""))
        lines += [f"honest member error: {e}" for e in out.honest.errors[:6]]
        lines.append(f"stream integrity: {len(out.honest.framing)} framing violations in what "
                     "the honest members received")
        lines += [f"framing violation: {e}" for e in out.honest.framing[:6]]
    if out.first_input:
        lines.append(f"first traceback right after: {out.first_input}")
    if out.crash_input and out.crash_input != out.first_input:
        lines.append(f"router found dead after: {out.crash_input}")
    if out.first_traceback:
        lines.append(f"first exception in the router log: {out.first_traceback}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="fuzzing time (bounded)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    ap.add_argument("--auth", action="store_true", help="start the router with a tokens file")
    ap.add_argument("--keep", type=Path, help="keep the router log in this directory")
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else random.randrange(1 << 32)
    print(f"fuzzing for {a.seconds:g} s with seed {seed} (replay: --seed {seed})", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = a.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        out = run(a.seconds, seed, a.auth, work, say=lambda s: print(s, flush=True))
    print(report(out, a.seconds, seed, a.auth), flush=True)
    return 0 if out.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
