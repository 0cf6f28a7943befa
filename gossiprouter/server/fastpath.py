"""The compiled fast path's Python half: the relay thread (server._relay) in the server.

Under light load a message is one wake-up, and the pure-Python dispatcher
(gossiprouter.server.dispatch) pays trio's wake-up and the interpreter for each; the kernel's share
is about half (docs/performance.md, "Light load"). With the fast path an OS thread written in
C (``server/relay/``, built by ``scripts/setup``) does the wait, the read and the send
of routed frames for plain-TCP connections of all three protocols, without the GIL. Python
keeps every decision:

* **Reading.** :meth:`FastPath.serve` replaces the dispatcher's ``serve`` for those
  connections. The thread reads them; a frame whose header Python has learned (below) it
  relays itself; anything else (control frames, a header not learned yet, an oversized or cut
  frame) ends its reading of that connection and comes back here as an *upcall*, which the
  dispatcher task hands to the connection's :class:`~gossiprouter.server.feeder.Feeder` exactly as
  the pure-Python dispatcher would; then the thread reads on. So a connection's frames are
  handled in order, and every waiting, budget, pause and error rule is the Feeder's as before.
  A cut frame the session kept at the end of an upcall is handed back to the thread
  (``Session.hand_back``), so a stream whose reads end inside frames stays on the thread.
* **Learning.** After a session routed a run of frames (``NativeSession._route``,
  ``JGroups2Session._run``, ``JGroups5Session._run``) it calls :meth:`learn_native` /
  :meth:`learn_jgroups`, which hand the
  thread that decision (the header's exact bytes, the receivers) when it can be repeated: every
  receiver is written by the thread (below) and none is in reconnect grace; a decision that a
  time window, budget or rate allowed is never taught (docs/architecture.md, "Only table
  decisions are repeated"). The routing table calls :meth:`RoutingTable.changed` with the
  group's name before every change of who receives what in it, which makes the thread forget
  that group's decisions (by a slot of the group's hash: another group's churn costs nothing
  here), under its mutex: a decision is never used after the change that made it stale.
* **Writing.** Every plain-TCP connection, whatever its protocol, is *attached* while its
  outbox is idle: its bytes go out through the thread's mutex (the outbox's direct send calls
  ``Relay.send``), so a frame relayed by the thread and one sent by Python never interleave.
  What a socket does not take at once goes back to the outbox (EVICT upcall, or at once for
  Python's own send), whose writer task, bounds and slow-consumer policy carry on as without
  the fast path; the connection is attached again when its outbox is idle. Waking the writer
  detaches the connection first (``Outbox.claim``): one writer owns a stream at a time
  (docs/architecture.md, "One writer per stream").

A frame for a receiver that is evicted (or no longer attached) is not relayed: it goes to
Python with the rest of its read, so Python's queue bounds, back-pressure (Congestion) and
slow-consumer policy decide, as without the fast path. The thread holds no more than Python
would: it sends from its read buffer (one frame routed to many receivers is in memory once),
copies only what a socket did not take (taken at once into the outbox: the EVICT upcall), keeps
no buffer for a connection between reads except the start of a cut frame, in a buffer of its
size, and keeps all that within ``fast_path_max_bytes`` router-wide (a frame whose copies could
exceed it goes through Python). Counters it keeps, and the bytes it holds (in the
``partial_bytes`` and queued-bytes gauges), are folded into the hub's by :meth:`collect` (the
reaper, and the operations layer before it reads them).

``fast_path`` (option): ``auto`` (default) uses it when the extension is built, ``on``
requires it, ``off`` never uses it. The environment variable ``GOSSIPROUTER_FAST_PATH``
(``on``/``off``) overrides ``auto``: ``scripts/test`` runs the suite both ways with it (``on``
there requires the extension, but a config with ``dispatcher`` or ``direct_send`` off still
runs without the fast path, which is built on both).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import TYPE_CHECKING, TypeVar

import trio

from gossiprouter.core.config import Config, ConfigError
from gossiprouter.server.broker_link import BrokerLink
from gossiprouter.server.dispatch import END, READ, Feed, Parked, current_task, wait_in
from gossiprouter.server.fast_direct import Direct, no_bytes
from gossiprouter.server.remote_share import RemoteShare, split

if TYPE_CHECKING:
    from gossiprouter.routing.entries import Carrier
    from gossiprouter.sessions.base import Hub, Session
    from gossiprouter.sessions.counters import Counters

ENV = "GOSSIPROUTER_FAST_PATH"
# How to get the extension, from a checkout or with pip: no need for the test stack that
# scripts/setup installs.
BUILD_HINT = ("it needs a C compiler and the Python headers, e.g. apt-get install gcc "
              "python3-dev, then scripts/setup --router in a checkout, or pip install . again")

log = logging.getLogger("gossiprouter")

F = TypeVar("F", bound=Feed)


# A build of the extension to load instead of the in-place one: the sanitized builds of the
# fast path's proof (scripts/sanitize, docs/architecture.md).
RELAY_SO = "GOSSIPROUTER_RELAY_SO"


def _load() -> tuple[ModuleType | None, str]:
    """The extension, or None and why (said only when it was asked for by path)."""
    path = os.environ.get(RELAY_SO, "")
    if not path:
        try:
            return importlib.import_module("gossiprouter.server._relay"), ""
        except ImportError:
            return None, ""
    spec = importlib.util.spec_from_file_location("gossiprouter.server._relay", path)
    if spec is None or spec.loader is None:
        return None, f"{RELAY_SO}={path}: not an extension module"
    try:
        mod = importlib.util.module_from_spec(spec)  # dlopen(): a missing file fails here
        spec.loader.exec_module(mod)
    except ImportError as e:  # a missing file, or a sanitizer's runtime not preloaded
        return None, f"{RELAY_SO}={path}: {e}"
    sys.modules["gossiprouter.server._relay"] = mod
    return mod, ""


_relay, _load_error = _load()


def available() -> bool:
    """The extension is built (``scripts/setup`` builds it; a pip install builds it when a C
    compiler is there)."""
    return _relay is not None


def wanted(config: Config) -> bool:
    """Whether a server with ``config`` runs the fast path; ConfigError when it must and
    cannot."""
    return status(config)[0]


def env_mode() -> str:
    """``on`` or ``off`` as GOSSIPROUTER_FAST_PATH says, or "" (unset or auto); ConfigError
    for any other value (the CLI checks it first: a bad value, exit status 2)."""
    env = os.environ.get(ENV, "").strip().lower()
    if env not in ("", "auto", "on", "off"):
        raise ConfigError(f"{ENV}={env!r}: expected on, off or auto")
    return "" if env == "auto" else env


def status(config: Config) -> tuple[bool, str]:
    """(whether a server with ``config`` runs the fast path, why: for the start-up line);
    ConfigError when it must and cannot."""
    mode = config.fast_path
    why = "option fast_path"
    env = ""
    if mode == "auto":
        env = env_mode()
        if env:
            mode, why = env, f"{ENV}={env}"
    if mode == "off":
        return False, f"off ({why})"
    if not (config.dispatcher and config.direct_send):
        # The fast path is the dispatcher's read path with direct sends: a config that turns
        # either off explicitly wins over the environment (the suite's tests of those paths).
        if mode == "on" and not env:
            raise ConfigError("fast_path on needs dispatcher and direct_send (one is off)")
        return False, "off (dispatcher or direct_send is off)"
    if _load_error:  # asked for by path: never silently the pure path instead
        raise ConfigError(_load_error)
    if _relay is None:
        if mode == "on":
            raise ConfigError(
                f"fast_path on: the compiled extension gossiprouter.server._relay is not built "
                f"({BUILD_HINT}; or set fast-path auto to run without it)")
        return False, f"off (gossiprouter.server._relay is not built: {BUILD_HINT})"
    n = config.fast_path_threads
    busy = f", and up to {n} for busy connections" if n else ""
    return True, f"on (compiled relay thread{busy}; scheduled {config.fast_path_sched})"


class _Slot:
    __slots__ = ("feeder", "lot", "outcome", "session")

    def __init__(self, feeder: Feed, session: Session) -> None:
        self.feeder = feeder
        self.session = session
        self.lot = Parked()
        self.outcome: int | BaseException = READ


class FastPath:
    """The relay thread and what the server and the sessions ask of it."""

    def __init__(self, hub: Hub) -> None:
        assert _relay is not None, "check available() first"
        self.mod = _relay
        self.relay = _relay.Relay(hub.config.fast_path_max_bytes,
                                  threads=hub.config.fast_path_threads,
                                  batch=hub.config.fast_path_sched == "batch")
        self.relay_send = self.relay.send
        self.hub = hub
        # The federation broker's connection on the thread, when the server has a bridge.
        self.link = BrokerLink(self.relay, self.mod, hub, self.ids, self.slot)
        # Connections the thread knows (open .. close), by id.
        self._sessions: dict[int, Session] = {}
        # Connections it reads now for their task, parked in serve().
        self._slots: dict[int, _Slot] = {}
        self._running = False
        # For tests and profiles: upcalls handled, routes learned, connections handed back to
        # their task for a wait (a spent turn or control budget, back-pressure).
        self.upcalls = 0
        self.by_kind = [0] * 8  # by kind: DATA, EOF, ERROR, EVICT, LOST, REMOTE(_J5, _J2)
        # What Python sends on of the frames the thread relayed locally (remote_share.py),
        # by upcall kind: each framing's frames cut by its own scanner.
        self.remote = RemoteShare(hub)
        self._remote_share: dict[int, Callable[[bytes], int]] = {
            self.mod.REMOTE: self.remote.send, self.mod.REMOTE_J5: self.remote.send_j5,
            self.mod.REMOTE_J2: self.remote.send_j2}
        self.learned = 0
        self.handbacks = 0
        # The largest frame the thread holds across reads: what Python holds without charging
        # the partial_frames_budget (see open()).
        self.max_hold = min(hub.config.preauth_max_frame, _relay.MAX_HOLD)
        hub.fast = self
        self._slots_n: int = _relay.GROUP_SLOTS
        hub.table.changed = self._changed

    def __len__(self) -> int:
        return len(self._slots)

    def slot(self, group: str) -> int:
        """The thread's invalidation slot of table group ``group`` (groups that share one
        only forget each other's decisions more often)."""
        return hash(group) % self._slots_n

    def _changed(self, group: str) -> None:
        self.relay.invalidate(self.slot(group))

    # ------------------------------------------------------------------ the task

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The task that handles the thread's upcalls: ``await nursery.start(fast.run)``."""
        relay = self.relay
        fd = relay.fileno()
        relay.start()
        refused = relay.info()["sched_refused"]
        if refused:  # the kernel said no: the threads run as they were, and the router on
            log.warning("fast path: fast_path_sched = batch refused by the kernel (%s): its "
                        "threads run with the default policy", os.strerror(refused))
        self._running = True
        task_status.started()
        try:
            while True:
                await trio.lowlevel.wait_readable(fd)
                try:
                    items = relay.upcalls()
                except MemoryError:  # they stay queued: again once some memory is back
                    log.warning("fast path: no memory to take the relay thread's upcalls")
                    await trio.sleep(0.01)
                    continue
                self._upcalls(items)
        finally:
            self._running = False
            relay.stop()
            for cid, slot in list(self._slots.items()):
                relay.unread(cid)
                self._handback(cid, slot, END)
            self.hub.table.changed = _unchanged
            self.collect()
            c = self.hub.counters
            # A breakdown, not a verdict: the first frames of each route always go to Python.
            log.info("fast path summary: %d routed frames, %d relayed by the relay thread and "
                     "%d handled in Python (%d routes learned, %d upcalls)", c.routed,
                     c.fast_relayed, c.routed - c.fast_relayed, self.learned, self.upcalls)

    def _upcalls(self, items: list[tuple[int, int, bytes]]) -> None:
        # The remote share of every REMOTE upcall of this batch leaves together, once they
        # are all handled: one broker message per destination router.
        try:
            self._handle(items)
        finally:
            if self.remote.held:
                self.remote.flush()

    def _handle(self, items: list[tuple[int, int, bytes]]) -> None:
        mod = self.mod
        slots = self._slots
        link = self.link
        remote_share = self._remote_share
        for cid, kind, data in items:
            self.upcalls += 1
            self.by_kind[kind] += 1
            if cid == link.in_cid:  # the federation broker's connection
                link.upcall(kind, data)
                continue
            share = remote_share.get(kind)
            if share is not None:  # a federated group's frames: their remote share
                share(data)
                continue
            if kind == mod.EVICT:
                s = self._sessions.get(cid)
                if s is not None:
                    self._reclaim(s)
                continue
            if kind == mod.LOST:
                # The thread had no memory to tell us something about this connection (bytes
                # to handle, its end, an eviction): it cannot go on, so it is closed, counted
                # in internal_errors and logged, like any failure confined to one connection.
                s = self._sessions.get(cid)
                if s is not None:
                    self.hub.contain(s, MemoryError("the relay thread could not queue an "
                                                    "upcall for it"), "relaying it")
                slot = slots.get(cid)
                if slot is not None:
                    self._handback(cid, slot, END)
                continue
            slot = slots.get(cid)
            if slot is None:  # its connection is closing: nobody reads it any more
                continue
            feeder = slot.feeder
            if kind == mod.DATA:
                if feeder.closed:
                    self._handback(cid, slot, END)
                    continue
                try:
                    step = feeder.feed(data)
                except Exception as e:  # raised in the connection's task, not here
                    self._handback(cid, slot, e)
                    continue
                if step == READ:
                    try:
                        self._read(cid, slot.session)
                    except (KeyError, OSError) as e:  # the socket is gone: its task closes it
                        self._handback(cid, slot, e if isinstance(e, KeyError) else END)
                else:
                    self._handback(cid, slot, step)
            elif kind == mod.EOF:
                try:
                    feeder.eof()
                except Exception as e:
                    self._handback(cid, slot, e)
                    continue
                self._handback(cid, slot, END)
            else:  # a read failed (reset): as trio's BrokenResourceError ends a reader
                self._handback(cid, slot, END)

    def _read(self, cid: int, session: Session) -> None:
        """Let the thread read ``session``'s connection (again). A cut frame the session kept
        is handed to the thread, which continues it with the next bytes (so a stream whose
        reads end inside frames stays on the thread); what the session cannot hand over makes
        the next chunk go to Python whole (``raw``)."""
        # The thread takes a cut frame only within its router-wide bound: beyond it Python
        # keeps the frame, under its own budget (and the next chunk comes up whole).
        held = session.hand_back(min(self.max_hold, self.relay.room())) if session.holding \
            else None
        if self.link.routing:  # what Python batched of its frames is published first
            self.link.before_read()
        if held is None:
            self.relay.read(cid, session.holding)
        else:
            self.relay.read(cid, False, held)

    def _handback(self, cid: int, slot: _Slot, outcome: int | BaseException) -> None:
        if self._slots.get(cid) is slot:
            del self._slots[cid]
        if not isinstance(outcome, BaseException) and outcome not in (READ, END):
            self.handbacks += 1
        slot.outcome = outcome
        slot.lot.unpark()

    # ------------------------------------------------------------------ connections

    def open(self, session: Session, sock: socket.socket, counters: Counters
             ) -> Callable[[bytes], int]:
        """Make ``session``'s plain-TCP connection known to the thread; returns the outbox's
        direct send (counted in ``counters``), which goes through the thread's mutex while the
        thread writes the connection too (it is *attached*: when a route to it is learned)."""
        mod = self.mod
        kind = {"native": mod.NATIVE, "jgroups2": mod.JG2, "jgroups5": mod.JG5}.get(
            session.protocol, 0)
        # The thread holds a frame cut by a read only up to what Python holds without charging
        # its partial_frames_budget (Session._reserve): a larger one goes to Python, budget and
        # all, so the router-wide bound holds with the fast path too.
        cid: int = self.relay.open(sock.fileno(), kind, self.max_hold)
        session.fast_id = cid
        self._sessions[cid] = session
        # Attached now, while its outbox is idle: a JGroups sender is one of the receivers of
        # its own multicasts, and while its Feeder runs, its outbox holds its replies (it could
        # not be attached when the route is learned). Connections the thread does not write
        # pay one mutex per send (relay.send).
        self.attach(session)
        # A bound method of one small object per connection, not a closure (issue 24).
        return Direct(self.relay_send, self._reclaim, session, cid, sock.send, counters).send

    def attach(self, session: Session) -> bool:
        """Let the thread write ``session``'s connection, if its outbox is idle."""
        if session.fast_attached:
            return True
        ob = session.outbox
        cid = session.fast_id
        if cid is None or ob.closed or ob.chunks or ob.busy:
            return False
        if not self.relay.attach(cid):
            return False
        session.fast_attached = True
        ob.reclaim = session.fast_take
        return True

    def take(self, session: Session) -> bytes:
        """The bytes the thread holds for ``session`` (which it stops writing)."""
        session.fast_attached = False
        session.outbox.reclaim = no_bytes
        cid = session.fast_id
        if cid is None:
            return b""
        data: bytes = self.relay.take(cid)
        return data

    def _reclaim(self, session: Session) -> None:
        """The thread could not write everything to ``session``: its outbox takes over
        (the held bytes first) and its writer task writes them."""
        ob = session.outbox
        if not session.fast_attached or ob.closed:
            return
        ob.claim()
        ob.wake()

    def close(self, session: Session) -> None:
        """The connection is over (before its socket is closed)."""
        cid = session.fast_id
        if cid is None:
            return
        self.collect()
        session.fast_id = None
        session.fast_attached = False
        session.outbox.reclaim = no_bytes
        self._sessions.pop(cid, None)
        self.relay.close(cid)

    def reads(self, session: Session) -> bool:
        """The thread can read this session's frames (every protocol it knows: native, JGroups
        2.12 and 5.x)."""
        return session.fast_id is not None and session.protocol in _READS

    async def serve(self, session: Session, feeder: F,
                    settle: Callable[[F, int], Awaitable[bool]]) -> None:
        """Like :meth:`gossiprouter.server.dispatch.Dispatcher.serve`, with the thread reading."""
        if not self._running:
            raise RuntimeError("the fast path's task is not running")
        cid = session.fast_id
        assert cid is not None
        slot = _Slot(feeder, session)
        self.attach(session)  # again, if it was evicted and its outbox is idle now
        while not feeder.closed:
            slot.outcome = READ
            self._slots[cid] = slot
            self._read(cid, session)
            slot.lot.task = current_task()
            try:
                await wait_in(slot.lot.abort)
            finally:
                if self._slots.get(cid) is slot:  # cancelled while the thread reads it
                    del self._slots[cid]
                    self.relay.unread(cid)
            outcome = slot.outcome
            if isinstance(outcome, BaseException):
                raise outcome
            if outcome == END or not await settle(feeder, outcome) or not self._running:
                return

    # ------------------------------------------------------------------ learning

    def ids(self, targets: tuple[Carrier, ...] | list[Carrier]) -> list[int] | None:
        ids = []
        for t in targets:
            s: Session = t  # type: ignore[assignment]  # carriers here are sessions
            cid = getattr(s, "fast_id", None)
            if cid is None or not self.attach(s):
                return None
            ids.append(cid)
        return ids

    def learn_native(self, session: Session, route: tuple[str, bytes | None, bytes],
                     frames: bytes) -> None:
        """``NativeSession._route`` delivered ``frames`` (a RUN) with ``route``."""
        key = session.scanner.header(frames, 4)  # type: ignore[attr-defined]
        if key is None:
            return
        group, dest, _sender = route
        table = self.hub.table
        g = table.groups.get(group)
        if g is None or g.graced:
            return
        if dest is None:
            targets = table.resolve_multicast(group, session)
        else:
            e = g.entries.get(dest)
            c = None if e is None else e.carrier
            if c is None:
                return
            targets = (c,)
        # Receivers on other routers (the federation's carriers) are Python's share: the
        # thread relays to the local ones and hands each frame up (REMOTE, _remote).
        local, remote = split(targets)
        ids = self.ids(local)
        # ... and published by the thread too while the broker link is up (broker_link.py).
        fed = self.link.targets(group, dest) if remote else None
        if ids is not None and self.relay.learn(
                session.fast_id, key, b"", 0,
                session.scanner.max_frame, ids, self.slot(group),  # type: ignore[attr-defined]
                remote, fed):
            self.learned += 1

    def learn_jgroups(self, session: Session, group: str, dest: bytes | None, key: bytes,
                      out: bytes, skip: int) -> None:
        """A JGroups session routed a run of MESSAGEs whose header is ``key`` to ``dest`` of
        table ``group`` (None: every member, the sender included): the thread sends each such
        frame as ``out`` followed by its bytes from ``skip`` on (2.12: the header re-wrapped;
        5.x: the frame as received)."""
        g = self.hub.table.groups.get(group)
        if g is None or g.graced:
            return
        if dest is None:
            targets = g.targets()
        else:
            e = g.entries.get(dest)
            if e is None or not e.carriers:
                return
            targets = (e.carriers[-1],)
        # As for native frames, receivers on other routers are the remote share: for 5.x
        # frames (every receiver gets them as received) published by the thread while the
        # broker link routes (a routed message carries any frames), else handed up
        # (REMOTE_J5, remote_share.py); 2.12 frames, re-wrapped for their receivers, are
        # handed up as received (REMOTE_J2), and Python re-wraps their remote share.
        local, remote = split(targets)
        ids = self.ids(local)
        fed = (self.link.targets(group, dest) if remote and session.protocol == "jgroups5"
               else None)
        if ids is not None and self.relay.learn(
                session.fast_id, key, out, skip,
                session.scanner.max_frame, ids, self.slot(group),  # type: ignore[attr-defined]
                remote, fed):
            self.learned += 1

    # ------------------------------------------------------------------ counters

    def collect(self) -> None:
        """Fold what the thread relayed since the last call into the hub's counters and the
        sessions' ``last_recv`` (the idle timeout's clock), and what it holds now into the
        gauges."""
        rows, now_ns, partial, pending, workers = self.relay.collect()
        self.link.collect()
        counters = self.hub.counters
        counters.fast_partial_bytes = partial
        counters.fast_pending_bytes = pending
        counters.fast_threads = workers
        if not rows:
            return
        # The thread's clock is CLOCK_MONOTONIC, trio's is time.perf_counter() plus an offset
        # (the same clock on Linux): ages carry over exactly.
        trio_now = _trio_now()
        sessions = self._sessions
        for cid, bytes_in, frames, delivered, bytes_out, writes, last_ns in rows:
            counters.bytes_in += bytes_in
            counters.routed += frames
            counters.fast_relayed += frames
            counters.delivered += delivered
            counters.bytes_out += bytes_out
            counters.writes += writes
            s = sessions.get(cid)
            if s is not None and last_ns and trio_now is not None:
                seen = trio_now - (now_ns - last_ns) / 1e9
                if seen > s.last_recv:
                    s.last_recv = seen

    def info(self) -> dict[str, int]:
        """The thread's own counters (rounds, upcalls, routes...), for tests and profiles."""
        d: dict[str, int] = self.relay.info()
        return d


_READS = frozenset({"native", "jgroups2", "jgroups5"})


def _trio_now() -> float | None:
    try:
        return trio.current_time()
    except RuntimeError:  # outside trio (a test folding counters by hand)
        return None


def _unchanged(group: str) -> None:
    pass

