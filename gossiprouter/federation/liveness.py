"""Per-peer liveness on the path the traffic takes (docs/federation.md, "Partitions between
brokers"): the sans-IO half. No trio, no sockets: tested with numbers.

Every router sends each other router a heartbeat every ``federation_heartbeat`` seconds on
that router's route topic, the one its routed frames take, so a cut between two bridged
brokers is seen even though each router still talks to its own broker. A heartbeat carries
its wall-clock send time, and echoes the send time of the last heartbeat received from the
destination with how long it was held: the round trip needs no shared clock.

* A peer heard from (heartbeat or routed frame) is **up**; one that sent heartbeats and then
  fell silent for ``federation_peer_timeout`` is **unreachable** (:meth:`Liveness.check`), and
  the federation holds its members in grace, then drops them.
* Routed frames carry their wall-clock send time. Their **age** is measured against the
  smallest (receive - send) of the peer's recent heartbeats, so a constant clock offset
  between the hosts cancels out; a frame older than ``federation_frame_age`` is dropped and
  counted (:meth:`Liveness.too_old`), never delivered late.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

# Heartbeats whose (receive - send) offset is remembered per peer (the smallest is the base
# of frame ages): about a minute at the default interval, so a stepped clock is forgotten.
OFFSETS = 32


@dataclass
class PeerLink:
    """What this router knows of the path to one other router."""

    origin: str
    up: bool = True
    last_heard: float = 0.0  # monotonic, this router's clock
    last_heard_wall: float = 0.0  # wall clock, for the metrics
    rtt: float | None = None  # seconds, from the last echoed heartbeat
    beats: bool = False  # it sends heartbeats (an older router does not: never timed out)
    sent: int = 0  # routed frames handed to the broker for it
    lost: int = 0  # routed frames for it not sent (broker not connected, queue full)
    expired: int = 0  # routed frames from it dropped as older than federation_frame_age
    # Its last heartbeat: its send time (its clock, ms) and when it arrived (monotonic).
    echo: tuple[int, float] | None = None
    offsets: deque[float] = field(default_factory=lambda: deque(maxlen=OFFSETS))

    def base(self) -> float:
        return min(self.offsets) if self.offsets else 0.0


class Liveness:
    """Every peer's link (see the module docstring)."""

    def __init__(self, timeout: float, frame_age: float) -> None:
        self.timeout = timeout
        self.frame_age = frame_age
        self.links: dict[str, PeerLink] = {}

    def link(self, origin: str) -> PeerLink:
        p = self.links.get(origin)
        if p is None:
            p = self.links[origin] = PeerLink(origin)
        return p

    def forget(self, origin: str) -> None:
        self.links.pop(origin, None)

    def heard(self, origin: str, now: float, wall: float) -> bool:
        """Something arrived from ``origin``: True when it was unreachable until now."""
        p = self.link(origin)
        p.last_heard, p.last_heard_wall = now, wall
        back = not p.up
        p.up = True
        return back

    def beat_out(self, origin: str, now: float, wall: float) -> bytes:
        """The heartbeat for ``origin``: ``sent echo held`` (milliseconds; echo 0: none)."""
        p = self.link(origin)
        echo, held = 0, 0
        if p.echo is not None:
            echo, held = p.echo[0], round((now - p.echo[1]) * 1000)
        return f"{round(wall * 1000)} {echo} {held}".encode()

    def beat_in(self, origin: str, payload: bytes, now: float, wall: float) -> bool:
        """A heartbeat from ``origin``: True when it was unreachable until now. ValueError
        for one that cannot be read."""
        sent, echo, held = (int(x) for x in payload.decode("ascii").split(" "))
        p = self.link(origin)
        p.beats = True
        p.echo = (sent, now)
        p.offsets.append(wall - sent / 1000)
        if echo:
            rtt = wall - echo / 1000 - held / 1000
            if rtt >= 0:
                p.rtt = rtt
        return self.heard(origin, now, wall)

    def too_old(self, origin: str, sent_ms: int, wall: float, count: int) -> bool:
        """Whether routed frames ``origin`` sent at ``sent_ms`` (its clock) are older than
        the frame-age limit here (then counted as expired)."""
        if self.frame_age <= 0:
            return False
        p = self.link(origin)
        if wall - sent_ms / 1000 - p.base() <= self.frame_age:
            return False
        p.expired += count
        return True

    def check(self, now: float) -> list[str]:
        """The peers that sent heartbeats and have now been silent for the timeout: marked
        unreachable, and returned (each once, until heard from again)."""
        out = []
        for p in self.links.values():
            if p.up and p.beats and self.timeout > 0 and now - p.last_heard > self.timeout:
                p.up = False
                out.append(p.origin)
        return out

    def restart(self, now: float) -> None:
        """A new broker session: the silence while there was none is not the peers'."""
        for p in self.links.values():
            p.last_heard = now
