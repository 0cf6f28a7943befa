"""A load-test peer process: many members, each with its own RouterStub channel, on one trio loop.

The driver (:mod:`gossiprouter.loadtest.driver`) starts ``python -m gossiprouter.loadtest.peer``
with pipes on stdin and stdout and talks to it in JSON lines (the *control channel*; stderr
is the peer's log). Commands, driver to peer::

    {"cmd": "config", "proc": 0, "run": "...", "records_dir": "...", "routers": ["h:p"],
     "scenario": {...Scenario.to_dict()...}, "stats_interval": 0.5}       (first line;
                                          a member connects to routers[its MemberSpec.router])
    {"cmd": "start", "t0_ns": ...}        start sending at that time.monotonic_ns()
    {"cmd": "leave", "id": 7, "member": "g1-2"}
    {"cmd": "join", "id": 8, "member": "g1-2"}
    {"cmd": "freeze", "id": 9}            stop recording and sending, flush (before a kill)

and notifications, peer to driver: ``joined`` / ``left`` (member, group, t_ns: the driver
writes the membership timeline from them), ``ready`` (every initial member joined),
``stats`` (counters, every ``stats_interval``), ``reply`` (id, ok, error), ``bye`` (final
counters, then the peer leaves its groups and exits 0) and ``error`` (fatal, then exit 1).

Life of a peer: join the initial members (``joined`` is sent after the router acknowledged
the CONNECT, with the time taken then), report ``ready``, wait for ``start``, send from
``t0`` for ``duration`` seconds, keep receiving for ``drain`` more seconds, stop recording,
flush the records, report ``bye`` and leave every group cleanly. The final leave is *not* a
membership event: the audit's "stayed connected" means connected until the end of the run.

Kills: the driver sends ``freeze``; the peer stops recording deliveries at once, stops its
senders (a send in progress completes and is recorded), flushes its records and replies.
The driver then records ``killed`` and sends SIGKILL: no row is lost, the stubs never
disconnect, and the router sees the connections drop as in a crash. Everything a member
received is recorded, and nothing after its ``killed`` time, so the audit is exact.
SIGTERM or SIGINT (the driver cleaning up after an error or Ctrl-C) flushes the records and
exits at once.

Each member gets its own RouterStub (one TCP connection per member, as each JGroups member
has its own TUNNEL connection) unless the scenario says ``stubs = "per-process"``, where all
members of the process share one stub. Rows go to one :class:`RecordWriter` per process
(buffered; written in batches).
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import struct
import sys
import time
import traceback
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn

import trio

from gossiprouter.loadtest.pacing import Pacer, PaceStats, trio_time_at
from gossiprouter.loadtest.records import RecordWriter
from gossiprouter.loadtest.resources import own_usage
from gossiprouter.loadtest.scenario import MemberSpec, Scenario, SendPattern
from gossiprouter.loadtest.scenario_file import parse_scenario
from gossiprouter.stub import Channel, ChannelClosedError, RouterStub, StubError

__all__ = ["HEADER", "PAYLOAD_MAGIC", "decode_header", "encode_payload", "main"]

log = logging.getLogger("gossiprouter.loadtest.peer")

PAYLOAD_MAGIC: Final = b"LT"
PAYLOAD_VERSION: Final = 1
HEADER: Final = struct.Struct("!2sBqqBB")
"""Payload header: magic ``LT``, version, seq, t_send_ns, sender name length, dest name
length; then the sender name, the dest name (empty for a multicast) and zero padding up to
the chosen size."""

START_TIMEOUT: Final = 120.0  # seconds between "ready" and "start" before giving up
STOP_SENDERS_TIMEOUT: Final = 10.0  # bound on waiting for a sender to finish its send
EXIT_ABORTED: Final = 143
LEAVE_TIMEOUT: Final = 5.0  # bound on the final clean leave of all the members

_PADDING = bytes(1 << 20)


def encode_payload(sender: bytes, seq: int, t_send_ns: int, dest: bytes | None,
                   size: int) -> bytes:
    """A test message of ``size`` bytes (at least the header: names of at most 255 bytes)."""
    d = dest or b""
    head = HEADER.pack(PAYLOAD_MAGIC, PAYLOAD_VERSION, seq, t_send_ns, len(sender), len(d))
    n = HEADER.size + len(sender) + len(d)
    return b"".join((head, sender, d, _PADDING[: max(0, size - n)]))


def decode_header(payload: bytes) -> tuple[str, int, int, str | None]:
    """``(sender, seq, t_send_ns, dest)`` of a test message; ValueError if it is not one."""
    try:
        magic, version, seq, t_send, ls, ld = HEADER.unpack_from(payload)
    except struct.error:
        raise ValueError("payload shorter than the load-test header") from None
    if magic != PAYLOAD_MAGIC or version != PAYLOAD_VERSION:
        raise ValueError("not a load-test payload")
    off = HEADER.size
    if len(payload) < off + ls + ld:
        raise ValueError("payload shorter than its names")
    sender = payload[off:off + ls].decode()
    dest = payload[off + ls:off + ls + ld].decode() if ld else None
    return sender, seq, t_send, dest


def warm_up_parquet(directory: Path) -> None:
    """Write and delete a one-row Parquet file under a hidden name.

    pyarrow initialises its Parquet writer lazily; the first write takes a few hundred
    milliseconds. Paying that before sending starts keeps it out of the latencies (the
    RecordWriter flushes inline, on the trio thread). Hidden names are ignored by readers.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gossiprouter.loadtest.records import RECORD_SCHEMA

    path = directory / f".warmup-{os.getpid()}.parquet"
    row: dict[str, list[object]] = {
        "run": ["w"], "kind": ["send"], "msg_id": ["w/0"], "seq": [0], "sender": ["w"],
        "receiver": [None], "group": ["w"], "cast": ["multicast"], "dest": [None],
        "size": [0], "t_send_ns": [0], "t_recv_ns": [None], "proc": [0],
    }
    try:
        pq.write_table(pa.Table.from_pydict(row, schema=RECORD_SCHEMA), path)
    finally:
        path.unlink(missing_ok=True)


class PeerFailure(Exception):
    """A fatal problem: reported to the driver in one line, then the peer exits 1."""


@dataclass(eq=False)
class Member:
    """The state of one member of this process."""

    spec: MemberSpec
    stub: RouterStub
    pattern: SendPattern
    others: list[tuple[str, bytes]]  # unicast destinations: the other members of the group
    rng: random.Random
    seq: int = 0
    chan: Channel | None = None  # None while not joined; a new Channel for every join
    sender_scope: trio.CancelScope | None = None
    sender_done: trio.Event | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def addr(self) -> bytes:
        return self.spec.name.encode()


class Control:
    """The JSON-lines control channel to the driver (stdin / stdout pipes)."""

    def __init__(self, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream) -> None:
        self._receive = receive
        self._send = send
        self._buffer = bytearray()
        self._lock = trio.Lock()  # several tasks emit; a stream allows one writer at a time

    async def read(self) -> dict[str, Any] | None:
        """The next command, or None at end of input (the driver is gone)."""
        while True:
            i = self._buffer.find(b"\n")
            if i >= 0:
                line = bytes(self._buffer[:i])
                del self._buffer[:i + 1]
                if not line.strip():
                    continue
                msg = json.loads(line)
                if not isinstance(msg, dict):
                    raise PeerFailure(f"bad control line: {line[:80]!r}")
                return msg
            data = await self._receive.receive_some(65536)
            if not data:
                return None
            self._buffer += data

    async def emit(self, msg: dict[str, Any]) -> None:
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        async with self._lock:
            # If the driver is gone the write fails; the input side notices and ends the peer.
            with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self._send.send_all(data)


class Peer:
    """One peer process: its members, their stubs and channels, the record writer."""

    def __init__(self, config: dict[str, Any], control: Control) -> None:
        self.control = control
        self.proc = int(config["proc"])
        self.run_id = str(config["run"])
        self.routers: list[str] = list(config["routers"])
        self.stats_interval = float(config.get("stats_interval", 0.5))
        self.scenario: Scenario = parse_scenario(config["scenario"], source="<driver config>")
        s = self.scenario
        self.records_dir = Path(config["records_dir"])
        self.writer = RecordWriter(self.records_dir, run=self.run_id, proc=self.proc,
                                   batch_rows=int(config.get("batch_rows", 50_000)),
                                   flush_interval_s=float(config.get("flush_interval_s", 2.0)))
        self.sends_enabled = self.proc not in s.receive_only
        self.specs = s.members_of_process(self.proc)
        self.members: dict[str, Member] = {}
        self.t0_ns: int | None = None
        self.started = trio.Event()
        self.recording = True  # False once frozen: nothing more is recorded
        self.sent = 0
        self.received = 0
        self.errors = 0
        self.bad_payloads = 0
        self.dropped_closed = 0  # receive-buffer drops of channels already closed
        self.pacing = PaceStats()  # every member's send slots together
        self.last_error: str | None = None
        self._nursery: trio.Nursery | None = None

    @property
    def send_end_ns(self) -> int:
        assert self.t0_ns is not None
        return self.t0_ns + round(self.scenario.duration * 1e9)

    @property
    def drain_end_ns(self) -> int:
        return self.send_end_ns + round(self.scenario.drain * 1e9)

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        s = self.scenario
        opts = s.stub
        kwargs: dict[str, Any] = {
            "receive_buffer": opts.receive_buffer, "send_timeout": opts.send_timeout,
            "reconnect_initial": opts.reconnect_initial, "reconnect_max": opts.reconnect_max,
            "client_name": f"gossiprouter-loadtest/p{self.proc}",
        }
        warm_up_parquet(self.records_dir)
        async with AsyncExitStack() as stack:
            # A member's stub connects to its own router of the list (spec.router: always 0
            # without a federation); "per-process" shares one stub per router.
            shared: dict[int, RouterStub] = {}
            for spec in self.specs:
                stub = shared.get(spec.router) if s.stubs == "per-process" else None
                if stub is None:
                    stub = await stack.enter_async_context(
                        RouterStub([self.routers[spec.router]], **kwargs))
                    shared[spec.router] = stub
                group = s.group(spec.group)
                others = [(o.name, o.name.encode()) for o in s.members_of_group(spec.group)
                          if o.name != spec.name]
                # One generator per member, seeded from the scenario: runs repeat exactly.
                rng = random.Random(f"{s.seed}/{spec.name}")
                self.members[spec.name] = Member(spec, stub, group.send, others, rng)
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.control_loop)
                nursery.start_soon(self.stats_loop)
                nursery.start_soon(self.signal_loop)
                async with trio.open_nursery() as joins:
                    for m in self.members.values():
                        if m.spec.initially_joined:
                            joins.start_soon(self.join, m)
                await self.control.emit({"ev": "ready"})
                with trio.move_on_after(START_TIMEOUT) as cs:
                    await self.started.wait()
                if cs.cancelled_caught:
                    raise PeerFailure(f"no start command within {START_TIMEOUT:g} s")
                await trio.sleep_until(trio_time_at(self.drain_end_ns))
                # The end: nothing is recorded from here on, so the records end cleanly.
                self.recording = False
                await self.stop_senders()
                self.writer.flush()
                await self.control.emit({"ev": "bye", **self.counters()})
                nursery.cancel_scope.cancel()
            # A clean leave: DISCONNECT every channel, all stubs at once and bounded (each
            # stub bounds its own wait too), so a router that is down cannot hold us long.
            with trio.move_on_after(LEAVE_TIMEOUT):
                async with trio.open_nursery() as leaving:
                    for stub in {id(m.stub): m.stub for m in self.members.values()}.values():
                        leaving.start_soon(stub.aclose)
        self.writer.close()

    def counters(self) -> dict[str, Any]:
        dropped = self.dropped_closed + sum(m.chan.dropped for m in self.members.values()
                                            if m.chan is not None)
        stubs = {id(m.stub): m.stub for m in self.members.values()}
        by_code: dict[str, int] = {}
        for st in stubs.values():
            for code, n in st.stats.async_errors.items():
                by_code[code] = by_code.get(code, 0) + n
        router_errors = sum(by_code.values())
        cpu_s, rss_bytes = own_usage()
        # The receiver-side framing check: bytes from the router that are not whole frames
        # (the stub's decoder counts them), never expected of a sound router.
        framing = sum(st.stats.bad_frames for st in stubs.values())
        return {
            "t_ns": time.monotonic_ns(),
            "sent": self.sent,
            "received": self.received,
            "errors": self.errors + router_errors + framing,
            "send_errors": self.errors,
            "router_errors": router_errors,
            "router_errors_by_code": by_code,
            "framing_violations": framing,
            "bad_payloads": self.bad_payloads,
            "dropped": dropped,
            "joined": sum(1 for m in self.members.values() if m.chan is not None),
            "files": len(self.writer.files),
            "last_error": self.last_error,
            **self.pacing.counters(),
            # For the run's environment (gossiprouter.loadtest.resources).
            "cpu_s": round(cpu_s, 3),
            "rss_bytes": rss_bytes,
        }

    async def stats_loop(self) -> None:
        while True:
            await trio.sleep(self.stats_interval)
            await self.control.emit({"ev": "stats", **self.counters()})

    async def signal_loop(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.warning("p%d: %s: flushing the records and exiting", self.proc,
                            signal.Signals(signum).name)
                self.abort(EXIT_ABORTED)

    def abort(self, code: int) -> NoReturn:
        """Flush what is recorded and exit now, without leaving the groups."""
        self.recording = False
        try:
            self.writer.flush()
        finally:
            os._exit(code)

    # ------------------------------------------------------------------ commands

    async def control_loop(self) -> None:
        while True:
            msg = await self.control.read()
            if msg is None:
                log.error("p%d: the control channel closed (driver gone): exiting", self.proc)
                self.abort(1)
            cmd = msg.get("cmd")
            if cmd == "start":
                self.start(int(msg["t0_ns"]))
                continue
            req = msg.get("id")
            try:
                if cmd in ("leave", "join"):
                    m = self.members.get(str(msg.get("member")))
                    if m is None:
                        raise PeerFailure(f"no member {msg.get('member')!r} in process "
                                          f"{self.proc}")
                    await (self.leave(m) if cmd == "leave" else self.join(m))
                elif cmd == "freeze":
                    await self.freeze()
                    # The final counters: the driver shows them after the kill.
                    await self.control.emit({"ev": "stats", **self.counters()})
                else:
                    raise PeerFailure(f"unknown command {cmd!r}")
            except StubError as e:
                self.errors += 1
                self.last_error = f"{cmd} {msg.get('member')}: {e}"
                await self.control.emit({"ev": "reply", "id": req, "ok": False,
                                         "error": self.last_error})
            else:
                await self.control.emit({"ev": "reply", "id": req, "ok": True, "error": None})

    def start(self, t0_ns: int) -> None:
        if self.t0_ns is not None:
            return
        self.t0_ns = t0_ns
        self.started.set()
        for m in self.members.values():
            if m.chan is not None:
                self.start_sender(m, m.chan)

    async def join(self, m: Member) -> None:
        if m.chan is not None:
            raise PeerFailure(f"{m.name} is already joined")
        chan = await m.stub.connect(m.spec.group, m.addr, name=m.name)
        # Taken after the router acknowledged the CONNECT: the member gets all sent from now.
        t = time.monotonic_ns()
        m.chan = chan
        assert self._nursery is not None
        self._nursery.start_soon(self.receive_loop, m, chan)
        await self.control.emit({"ev": "joined", "member": m.name, "group": m.spec.group,
                                 "t_ns": t})
        if self.t0_ns is not None:
            self.start_sender(m, chan)

    async def leave(self, m: Member) -> None:
        chan = m.chan
        if chan is None:
            raise PeerFailure(f"{m.name} is not joined")
        await self.stop_sender(m)
        # Taken before disconnecting; nothing received from now on is recorded for this
        # member, so its records never show a delivery after its leave.
        t = time.monotonic_ns()
        m.chan = None
        self.dropped_closed += chan.dropped
        await self.control.emit({"ev": "left", "member": m.name, "group": m.spec.group,
                                 "t_ns": t})
        await chan.disconnect()

    async def freeze(self) -> None:
        """Before a kill: stop recording and sending, and write everything recorded."""
        self.recording = False
        await self.stop_senders()
        # Synchronous on purpose: nothing else runs until the rows are on disk.
        self.writer.flush()

    # ------------------------------------------------------------------ sending

    def start_sender(self, m: Member, chan: Channel) -> None:
        if not self.sends_enabled or not self.recording or m.sender_scope is not None:
            return
        if time.monotonic_ns() >= self.send_end_ns:
            return
        m.sender_scope = trio.CancelScope(deadline=trio_time_at(self.send_end_ns))
        m.sender_done = trio.Event()
        assert self._nursery is not None
        self._nursery.start_soon(self.send_loop, m, chan, m.sender_scope, m.sender_done)

    async def stop_sender(self, m: Member) -> None:
        scope, done = m.sender_scope, m.sender_done
        if scope is None or done is None:
            return
        scope.cancel()
        # A send in progress completes (the stub shields the write) and is recorded.
        with trio.move_on_after(STOP_SENDERS_TIMEOUT):
            await done.wait()
        m.sender_scope = m.sender_done = None

    async def stop_senders(self) -> None:
        async with trio.open_nursery() as n:
            for m in self.members.values():
                n.start_soon(self.stop_sender, m)

    async def send_loop(self, m: Member, chan: Channel, scope: trio.CancelScope,
                        done: trio.Event) -> None:
        assert self.t0_ns is not None
        rate = m.pattern.rate
        try:
            with scope:
                if rate is None:
                    while True:  # ends at the scope's deadline (the end of sending)
                        await self.send_one(m, chan)
                # Late and skipped slots are counted (coordinated omission, see pacing.py);
                # more than a second behind (the router was down, say), the missed slots
                # are skipped instead of sent in a burst.
                pacer = Pacer(rate, trio_time_at(max(self.t0_ns, time.monotonic_ns())),
                              self.pacing)
                while True:
                    await pacer.wait()
                    await self.send_one(m, chan)
        except ChannelClosedError:
            pass  # the stub or channel closed under us: this member sends no more
        finally:
            done.set()

    async def send_one(self, m: Member, chan: Channel) -> None:
        pat, rng = m.pattern, m.rng
        if pat.sizes is not None:
            size = pat.sizes[0] if len(pat.sizes) == 1 else rng.choice(pat.sizes)
        else:
            assert pat.size_range is not None
            size = rng.randint(*pat.size_range)
        dest_name: str | None = None
        dest: bytes | None = None
        if pat.unicast and rng.random() < pat.unicast:
            dest_name, dest = rng.choice(m.others)
        seq = m.seq
        m.seq += 1  # used even if the send fails, so msg_ids stay unique
        t = time.monotonic_ns()
        payload = encode_payload(m.addr, seq, t, dest, size)
        try:
            await chan.send(payload, dest)
        except ChannelClosedError:
            raise
        except StubError as e:
            # Not handed to the stub: no send row (the message does not exist for the audit).
            self.errors += 1
            self.last_error = f"send from {m.name}: {e}"
            return
        # No checkpoint since the send returned: a cancellation cannot separate the two.
        self.writer.send(m.name, seq, m.spec.group, len(payload), dest=dest_name, t_send_ns=t)
        self.sent += 1

    # ------------------------------------------------------------------ receiving

    async def receive_loop(self, m: Member, chan: Channel) -> None:
        receiver, group = m.name, chan.group
        record = self.writer.recv
        while True:
            try:
                msg = await chan.receive()
            except ChannelClosedError:
                return
            # Take everything already buffered without a trip through the scheduler each.
            while True:
                t_recv = time.monotonic_ns()
                # Only while this very channel is the member's: nothing after a leave, even if
                # the member has joined again meanwhile (a new channel).
                if m.chan is chan and self.recording:
                    try:
                        sender, seq, t_send, dest = decode_header(msg.payload)
                    except (ValueError, UnicodeDecodeError) as e:
                        self.bad_payloads += 1
                        self.errors += 1
                        self.last_error = f"{receiver}: bad payload from {msg.sender!r}: {e}"
                    else:
                        record(sender, seq, group, receiver, len(msg.payload), t_send,
                               dest=dest, t_recv_ns=t_recv)
                        self.received += 1
                try:
                    msg = chan.receive_nowait()
                except trio.WouldBlock:
                    break
                except ChannelClosedError:
                    return


# --------------------------------------------------------------------------- entry point


async def _main_async(control: Control) -> None:
    config = await control.read()
    if config is None:
        raise PeerFailure("no configuration on the control channel")
    if config.get("cmd") != "config":
        raise PeerFailure(f"expected a config command first, got {config.get('cmd')!r}")
    peer = Peer(config, control)
    try:
        await peer.run()
    except BaseException:
        # Whatever went wrong, what was recorded so far reaches the disk.
        peer.recording = False
        peer.writer.flush()
        raise


def main() -> None:
    """Run one peer on the control channel on stdin/stdout (see the module docstring)."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The control channel keeps the real stdout; fd 1 then points at stderr so that a stray
    # print() cannot corrupt the JSON lines.
    out_fd, in_fd = os.dup(1), os.dup(0)
    os.dup2(2, 1)
    control = Control(trio.lowlevel.FdStream(in_fd), trio.lowlevel.FdStream(out_fd))
    try:
        trio.run(_main_async, control)
    except BaseException as e:  # one line to the driver; the traceback to the log (stderr)
        traceback.print_exc()
        message = _describe(e)
        with suppress(OSError):
            os.write(out_fd, (json.dumps({"ev": "error", "message": message}) + "\n").encode())
        os._exit(1)


def _describe(e: BaseException) -> str:
    while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
        e = e.exceptions[0]
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(_describe(x) for x in e.exceptions[:3])
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}" if not isinstance(e, PeerFailure) else text


if __name__ == "__main__":
    main()
