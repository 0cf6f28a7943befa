"""The optional shared federation key (``federation_key_file``): every federation message is
signed, and a router with the key reads nothing unsigned or badly signed
(docs/federation.md, "Threat model").

Sans-IO: strings and bytes in, a property value or a refusal out; the MQTT side
(:mod:`gossiprouter.federation.peers`) carries the value as the MQTT 5 user property
:data:`MAC_PROPERTY` of every message under ``%fed/``, the Last Will included.

The value is ``run:seq:ts:mac``: ``run``, a random id of the writing router's process;
``seq``, a counter of that run; ``ts``, the writer's clock in milliseconds; ``mac``,
HMAC-SHA256 (stdlib :mod:`hmac`) over the topic, those three and the payload. So a message
cannot be moved to another topic (another router's subtree, another group), changed, or
signed without the key. Replays of genuine messages are refused as well:

* **live messages** (routed frames, the sync marker, deletions): ``ts`` within
  :data:`MAX_SKEW` of the reader's clock (the routers' clocks must agree that well: NTP),
  and ``seq`` above the last one seen from that run (one broker connection keeps a run's
  messages in order);
* **retained state** (a presence, a record): never older than the last one accepted on the
  same topic (``ts``), so an old record or presence cannot be put back;
* **a Last Will** (an empty presence), signed when the router connected: only for the run
  whose presence is the current one, so a Will of an earlier run of that router is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from pathlib import Path

from gossiprouter.federation.link import Link

MAC_PROPERTY = "gossiprouter-mac"
MAX_SKEW = 60_000  # ms: a live message's clock may differ from the reader's by this much
# Runs of other routers remembered for their sequence numbers, and retained topics for their
# time stamps (least recently used out beyond these).
MAX_RUNS = 4096
MAX_TOPICS = 200_000


class KeyFileError(ValueError):
    """The key file cannot be used (the message says why)."""


def read_key(path: str) -> bytes:
    """The key in ``path``: its bytes without surrounding white space, at least 16."""
    try:
        key = Path(path).read_bytes().strip()
    except OSError as e:
        raise KeyFileError(f"federation_key_file = {path!r}: cannot read it ({e})") from None
    if len(key) < 16:
        raise KeyFileError(f"federation_key_file = {path!r}: a key of at least 16 bytes is "
                        "needed (e.g. head -c 32 /dev/urandom | base64)")
    return key


def _mac(key: bytes, topic: str, head: str, payload: bytes) -> str:
    m = hmac.new(key, topic.encode(), hashlib.sha256)
    m.update(b"\0" + head.encode() + b"\0")
    m.update(payload)
    return m.hexdigest()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Signer:
    """Signs what this router publishes (one per process run)."""

    def __init__(self, key: bytes, run: str) -> None:
        self.key = key
        self.run = run
        # One counter per kind of message: kinds may go at different QoS, which paho may
        # reorder between them, never within one.
        self.seqs: dict[str, int] = {}

    def sign(self, topic: str, payload: bytes, kind: str) -> str:
        seq = self.seqs[kind] = self.seqs.get(kind, 0) + 1
        head = f"{self.run}:{seq}:{_now_ms()}"
        return f"{head}:{_mac(self.key, topic, head, payload)}"


class Verifier:
    """Checks what this router reads (see the module docstring): :meth:`check` returns why a
    message must be refused, or None."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self._runs: OrderedDict[str, int] = OrderedDict()  # run -> last seq
        self._topics: OrderedDict[str, int] = OrderedDict()  # retained topic -> last ts
        self._current: dict[str, str] = {}  # writer -> run of its current presence
        # The relay thread's broker link, which checks route messages too (one sequence of
        # accepted numbers per run with it: federation/link.py); None: no link.
        self.link: Link | None = None

    def check(self, topic: str, payload: bytes, value: str | None, *, writer: str,
              kind: str, last_will: bool = False) -> str | None:
        if value is None:
            return "unsigned"
        parts = value.split(":")
        if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit() \
                or len(parts[1]) > 20 or len(parts[2]) > 20:
            return "malformed signature"
        run, seq_s, ts_s, mac = parts
        if not hmac.compare_digest(mac, _mac(self.key, topic, f"{run}:{seq_s}:{ts_s}", payload)):
            return "bad signature"
        seq, ts = int(seq_s), int(ts_s)
        if kind == "presence" and last_will:
            return None if self._current.get(writer) == run else "a Last Will of another run"
        retained = kind in ("presence", "members")
        last = self._topics.get(topic) if retained else None
        if last is not None and ts < last:
            return "older than the state accepted before on this topic"
        if retained and payload:  # retained: the broker hands it again at every resync
            self._remember(self._topics, topic, ts, MAX_TOPICS)
            if kind == "presence":
                self._current[writer] = run
            return None
        if abs(_now_ms() - ts) > MAX_SKEW:
            return "too old or from the future (clocks more than 60 s apart?)"
        key = f"{run}/{kind}"
        last = self._runs.get(key, 0)
        link = self.link if kind == "route" else None
        if link is not None:  # the relay thread accepts route messages of its own
            last = max(last, link.floor(run))
        if seq <= last:
            return "replayed"
        self._remember(self._runs, key, seq, MAX_RUNS)
        if link is not None:
            link.seen(run, seq)
        if retained:  # a deletion: what was retained before it cannot come back
            self._remember(self._topics, topic, ts, MAX_TOPICS)
        return None

    def forget(self, writer: str) -> None:
        """Router ``writer`` is gone: its Will cannot be replayed once it is dropped."""
        self._current.pop(writer, None)

    @staticmethod
    def _remember(d: OrderedDict[str, int], k: str, v: int, bound: int) -> None:
        d[k] = v
        d.move_to_end(k)
        if len(d) > bound:
            d.popitem(last=False)
