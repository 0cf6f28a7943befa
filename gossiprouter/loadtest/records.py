"""The load-test record format, and the writers that load-test processes use to produce it.

This module is the contract between the load-test driver (which writes records) and the
analysis job in :mod:`gossiprouter.analytics.audit` (which reads them). It needs pyarrow but
not Spark, so peers can write records without a JVM.

Layout of a run directory
=========================

``RUN_DIR/records/``
    One or more Parquet files per peer process, each a complete Parquet file (written whole,
    then renamed into place, so a peer killed with SIGKILL leaves only complete files; it
    loses at most the rows still buffered in memory). Files whose names start with ``.`` or
    ``_`` are ignored by the reader. Schema :data:`RECORD_SCHEMA`, one row per event:

    ========== ======= ========== ======================================================
    column     type    nullable   meaning
    ========== ======= ========== ======================================================
    run        string  no         run id, the same for every row of a run
    kind       string  no         ``"send"`` (written by the sender when it hands the
                                  message to its stub) or ``"recv"`` (written by a
                                  receiver for every copy it is handed, duplicates too)
    msg_id     string  no         ``f"{sender}/{seq}"``, unique per message in the run
    seq        int64   no         per-sender sequence number, from 0, +1 per message the
                                  sender sends, whatever its group or destination
    sender     string  no         member name of the sender
    receiver   string  yes        member name of the receiver; null for ``"send"``
    group      string  no         group the message was sent in
    cast       string  no         ``"unicast"`` or ``"multicast"``
    dest       string  yes        addressed member for unicast; null for multicast
    size       int32   no         payload size in bytes
    t_send_ns  int64   no         ``time.monotonic_ns()`` at the sender just before the send
                                  (a receiver copies it from the payload header)
    t_recv_ns  int64   yes        ``time.monotonic_ns()`` at the receiver when the message
                                  was handed to it; null for ``"send"``
    proc       int32   no         number of the peer process that wrote the row
    ========== ======= ========== ======================================================

    ``t_send_ns`` and ``t_recv_ns`` come from ``CLOCK_MONOTONIC``, which is one clock for all
    processes on one machine, so latencies are comparable across processes. Runs spread over
    several machines need a shared clock instead; the analysis assumes one.

    The payload of each test message must carry at least ``sender``, ``seq``, ``t_send_ns``
    and ``dest`` so that receivers can write their rows; ``size`` is the payload length.

``RUN_DIR/membership.parquet``
    The membership timeline, schema :data:`MEMBERSHIP_SCHEMA`, written by the process that
    starts, stops and kills peers (:class:`MembershipWriter`). It may also be a directory of
    that name holding several Parquet files (for example one per process); the reader
    handles both.

    ======= ======= ===========================================================================
    column  type    meaning
    ======= ======= ===========================================================================
    t_ns    int64   ``time.monotonic_ns()`` of the event (same clock as the records)
    group   string  the group
    member  string  the member name (as in ``sender`` / ``receiver`` of the records)
    event   string  ``"join"``: taken *after* the member's connect to the router has been
                    acknowledged, so it receives anything sent from then on;
                    ``"leave"``: taken *before* the member starts disconnecting;
                    ``"killed"``: taken *before* the member's process is sent the signal
                    (one row per group the member was in)
    ======= ======= ===========================================================================

    Taking the times on that side of each action errs towards "undetermined" rather than
    towards a false loss. A member may leave and join again; each join opens a new interval.

``RUN_DIR/manifest.json``
    Free-form JSON object (scenario, versions, host facts); the analysis copies it into the
    report unchanged.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Self

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "MANIFEST_FILE",
    "MEMBERSHIP_FILE",
    "MEMBERSHIP_SCHEMA",
    "RECORDS_DIR",
    "RECORD_SCHEMA",
    "MembershipEvent",
    "MembershipWriter",
    "RecordWriter",
    "make_msg_id",
    "write_manifest",
    "write_records_table",
    "write_table",
]

RECORDS_DIR: Final = "records"
MEMBERSHIP_FILE: Final = "membership.parquet"
MANIFEST_FILE: Final = "manifest.json"

RECORD_SCHEMA: Final = pa.schema(
    [
        pa.field("run", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("msg_id", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("sender", pa.string(), nullable=False),
        pa.field("receiver", pa.string(), nullable=True),
        pa.field("group", pa.string(), nullable=False),
        pa.field("cast", pa.string(), nullable=False),
        pa.field("dest", pa.string(), nullable=True),
        pa.field("size", pa.int32(), nullable=False),
        pa.field("t_send_ns", pa.int64(), nullable=False),
        pa.field("t_recv_ns", pa.int64(), nullable=True),
        pa.field("proc", pa.int32(), nullable=False),
    ]
)
"""Schema of every file under ``RUN_DIR/records/``."""

MEMBERSHIP_SCHEMA: Final = pa.schema(
    [
        pa.field("t_ns", pa.int64(), nullable=False),
        pa.field("group", pa.string(), nullable=False),
        pa.field("member", pa.string(), nullable=False),
        pa.field("event", pa.string(), nullable=False),
    ]
)
"""Schema of ``RUN_DIR/membership.parquet``."""

MembershipEvent = Literal["join", "leave", "killed"]
MEMBERSHIP_EVENTS: Final[frozenset[str]] = frozenset({"join", "leave", "killed"})


def make_msg_id(sender: str, seq: int) -> str:
    """The ``msg_id`` of the message that ``sender`` sent with sequence number ``seq``."""
    return f"{sender}/{seq}"


def _write_atomically(table: pa.Table, path: Path) -> None:
    # Write under a hidden temporary name and rename: readers (Spark skips names starting
    # with "."), and a kill in the middle of the write, never see a file without its footer.
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def write_records_table(records_dir: str | os.PathLike[str], table: pa.Table, name: str) -> Path:
    """Write a whole table of records as ``records_dir/name`` (bulk producers, benchmarks).

    The table must have exactly :data:`RECORD_SCHEMA` (nullability aside); ``name`` should end
    with ``.parquet``. Returns the path written.
    """
    if not table.schema.equals(RECORD_SCHEMA, check_metadata=False):
        # Cast rather than trust: a column written as int32 instead of int64 would make the
        # reader's fixed schema fail far from the cause.
        table = table.select(RECORD_SCHEMA.names).cast(RECORD_SCHEMA)
    return write_table(records_dir, name, table)


def write_table(directory: str | os.PathLike[str], name: str, table: pa.Table) -> Path:
    """Write ``table`` whole as ``directory/name`` (created if needed), atomically; returns
    the path. The one writer of a complete file, for ROUTE and topics runs alike."""
    path = Path(directory) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(table, path)
    return path


def write_manifest(run_dir: str | os.PathLike[str], manifest: dict[str, Any]) -> Path:
    """Write ``RUN_DIR/manifest.json`` whole, atomically (under a hidden name, then renamed);
    returns the path. The one writer of a manifest, for ROUTE and topics runs alike."""
    path = Path(run_dir) / MANIFEST_FILE
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, path)
    return path


class _ClosedOnExit:
    """``with writer as w:`` closes the writer however the block ends (the writers'
    ``close`` writes what is buffered, so a failing run still leaves its records)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class RecordWriter(_ClosedOnExit):
    """Buffers record rows of one peer process and writes them as Parquet files in batches.

    Each flush writes one new complete file ``records_dir/p{proc}-{token}-{part}.parquet``.
    A flush happens when ``batch_rows`` rows are buffered, when ``flush_interval_s`` has
    passed since the last flush (checked when a row is added, so a killed peer loses at most
    that much), on :meth:`flush` and on :meth:`close`. Flushing is blocking file I/O of a few
    milliseconds; from trio code call :meth:`flush` through ``trio.to_thread.run_sync`` if that
    matters. Not thread-safe: use one writer per process (or per thread).

    Example::

        with RecordWriter(run_dir / "records", run="r1", proc=3) as w:
            w.send("p3", seq=0, group="g", size=100, t_send_ns=t0)
            w.recv("p1", seq=7, group="g", receiver="p3", size=100, t_send_ns=t1)
    """

    def __init__(
        self,
        records_dir: str | os.PathLike[str],
        run: str,
        proc: int,
        *,
        batch_rows: int = 50_000,
        flush_interval_s: float = 2.0,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        if batch_rows < 1:
            raise ValueError("batch_rows must be at least 1")
        self._dir = Path(records_dir)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._run = run
        self._proc = proc
        self._batch_rows = batch_rows
        self._flush_interval_ns = int(flush_interval_s * 1e9)
        self._clock = clock
        # A random token keeps file names unique even if two writers share a proc number.
        self._token = uuid.uuid4().hex[:8]
        self._part = 0
        self._closed = False
        self._last_flush_ns = time.monotonic_ns()
        self._rows = 0
        self._cols: dict[str, list[object]] = {name: [] for name in RECORD_SCHEMA.names}
        self.files: list[Path] = []
        """Paths of the files written so far."""

    @property
    def buffered(self) -> int:
        """Rows added but not yet written."""
        return self._rows

    def send(
        self,
        sender: str,
        seq: int,
        group: str,
        size: int,
        *,
        dest: str | None = None,
        t_send_ns: int | None = None,
    ) -> str:
        """Record that ``sender`` sent message ``seq`` (to ``dest``, or to the group if None).

        ``t_send_ns`` defaults to now on the writer's clock. Returns the message's ``msg_id``.
        """
        t = self._clock() if t_send_ns is None else t_send_ns
        return self._add("send", sender, seq, None, group, dest, size, t, None)

    def recv(
        self,
        sender: str,
        seq: int,
        group: str,
        receiver: str,
        size: int,
        t_send_ns: int,
        *,
        dest: str | None = None,
        t_recv_ns: int | None = None,
    ) -> str:
        """Record that ``receiver`` was handed message ``seq`` of ``sender``.

        ``dest`` and ``t_send_ns`` are the values the sender put in the payload header (dest
        None for a multicast); ``t_recv_ns`` defaults to now. Call it for every copy received,
        duplicates included. Returns the message's ``msg_id``.
        """
        t = self._clock() if t_recv_ns is None else t_recv_ns
        return self._add("recv", sender, seq, receiver, group, dest, size, t_send_ns, t)

    def _add(
        self,
        kind: str,
        sender: str,
        seq: int,
        receiver: str | None,
        group: str,
        dest: str | None,
        size: int,
        t_send_ns: int,
        t_recv_ns: int | None,
    ) -> str:
        if self._closed:
            raise ValueError("RecordWriter is closed")
        msg_id = make_msg_id(sender, seq)
        c = self._cols
        c["run"].append(self._run)
        c["kind"].append(kind)
        c["msg_id"].append(msg_id)
        c["seq"].append(seq)
        c["sender"].append(sender)
        c["receiver"].append(receiver)
        c["group"].append(group)
        c["cast"].append("multicast" if dest is None else "unicast")
        c["dest"].append(dest)
        c["size"].append(size)
        c["t_send_ns"].append(t_send_ns)
        c["t_recv_ns"].append(t_recv_ns)
        c["proc"].append(self._proc)
        self._rows += 1
        if self._rows >= self._batch_rows or (
            time.monotonic_ns() - self._last_flush_ns >= self._flush_interval_ns
        ):
            self.flush()
        return msg_id

    def flush(self) -> Path | None:
        """Write the buffered rows as one new file; returns its path (None if nothing to write)."""
        self._last_flush_ns = time.monotonic_ns()
        if self._rows == 0:
            return None
        table = pa.Table.from_pydict(self._cols, schema=RECORD_SCHEMA)
        path = self._dir / f"p{self._proc:04d}-{self._token}-{self._part:06d}.parquet"
        _write_atomically(table, path)
        self._part += 1
        self.files.append(path)
        for col in self._cols.values():
            col.clear()
        self._rows = 0
        return path

    def close(self) -> None:
        """Flush what is buffered; the writer accepts no rows after this."""
        if not self._closed:
            self.flush()
            self._closed = True


class MembershipWriter(_ClosedOnExit):
    """Records the membership timeline of a run into ``RUN_DIR/membership.parquet``.

    The timeline is small (a few rows per member), so the whole file is rewritten atomically
    on each flush; with ``autoflush`` (the default) that is after every event, so the file is
    complete whenever the driver dies.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        autoflush: bool = True,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._autoflush = autoflush
        self._clock = clock
        self._rows: list[tuple[int, str, str, str]] = []
        self._dirty = False

    @property
    def path(self) -> Path:
        """Where the timeline is written."""
        return self._path

    def event(
        self, event: MembershipEvent, group: str, member: str, t_ns: int | None = None
    ) -> int:
        """Record ``event`` for ``member`` of ``group`` at ``t_ns`` (default now); returns t_ns."""
        if event not in MEMBERSHIP_EVENTS:
            raise ValueError(f"unknown membership event {event!r}")
        t = self._clock() if t_ns is None else t_ns
        self._rows.append((t, group, member, event))
        self._dirty = True
        if self._autoflush:
            self.flush()
        return t

    def join(self, group: str, member: str, t_ns: int | None = None) -> int:
        """Record that ``member`` joined ``group`` (call after the router acknowledged it)."""
        return self.event("join", group, member, t_ns)

    def leave(self, group: str, member: str, t_ns: int | None = None) -> int:
        """Record that ``member`` leaves ``group`` (call before it starts disconnecting)."""
        return self.event("leave", group, member, t_ns)

    def killed(self, group: str, member: str, t_ns: int | None = None) -> int:
        """Record that ``member`` is killed (call before signalling it; once per group)."""
        return self.event("killed", group, member, t_ns)

    def flush(self) -> None:
        """Rewrite the timeline file with every event so far."""
        if not self._dirty and self._path.exists():
            return
        cols: dict[str, list[object]] = {name: [] for name in MEMBERSHIP_SCHEMA.names}
        for row in self._rows:
            for name, value in zip(MEMBERSHIP_SCHEMA.names, row, strict=True):
                cols[name].append(value)
        table = pa.Table.from_pydict(cols, schema=MEMBERSHIP_SCHEMA)
        _write_atomically(table, self._path)
        self._dirty = False

    def close(self) -> None:
        """Write the timeline (even an empty one)."""
        self.flush()
