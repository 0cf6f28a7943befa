"""Who may connect: client-network allow-lists per protocol, and the JGroups switch.

JGroups clients carry no credentials, so the only control over them is where
they connect from. The policy is checked twice per connection, both times on
the peer IP only: at accept, a peer no served protocol would admit is cut at
once (before any TLS handshake); once the first bytes say which protocol the
connection speaks, that protocol's list decides.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gossiprouter.core.addresses import parse_hostport
from gossiprouter.core.config import Config
from gossiprouter.core.options import parse_network

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

PROTOCOLS = ("native", "jgroups2", "jgroups5")
_EVERYWHERE = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))


@dataclass
class AllowList:
    """Networks a protocol may be spoken from; ``enabled`` false refuses everyone."""

    networks: tuple[Network, ...]
    enabled: bool = True
    everyone: bool = field(init=False)

    def __post_init__(self) -> None:
        self.everyone = self.enabled and all(n in self.networks for n in _EVERYWHERE)

    def admits(self, ip: IPAddress | None) -> bool:
        if self.everyone:
            return True
        if not self.enabled or ip is None:
            return False
        return any(ip in n for n in self.networks if n.version == ip.version)


class AccessPolicy:
    """The allow-list of every protocol; ``verdict`` says why a peer is refused."""

    def __init__(self, lists: dict[str, AllowList]) -> None:
        self.lists = lists
        self.everyone = all(a.everyone for a in lists.values())

    @classmethod
    def from_config(cls, cfg: Config) -> AccessPolicy:
        return cls({
            "native": AllowList(_networks(cfg.allow_native)),
            "jgroups2": AllowList(_networks(cfg.allow_jgroups2), enabled=cfg.jgroups),
            "jgroups5": AllowList(_networks(cfg.allow_jgroups5), enabled=cfg.jgroups),
        })

    def verdict(self, protocol: str, ip: IPAddress | None) -> str | None:
        """None if ``ip`` may speak ``protocol``, else the reason (a metric label)."""
        a = self.lists.get(protocol)
        if a is None or a.admits(ip):
            return None
        return "disabled" if not a.enabled else "network"

    def admits_any(self, ip: IPAddress | None) -> bool:
        """Could ``ip`` speak any protocol at all? (checked at accept)"""
        return self.everyone or any(a.admits(ip) for a in self.lists.values())


def peer_host(peer: str) -> str:
    """The host of a peer as the server names it (``host:port``, ``[v6]:port``: see
    :func:`gossiprouter.core.addresses.format_hostport`); "" when ``peer`` is not one."""
    try:
        return parse_hostport(peer, allow_zero=True)[0]
    except ValueError:
        return ""


def peer_ip(peer: str) -> IPAddress | None:
    """The IP of a ``host:port`` peer string; IPv4-mapped IPv6 counts as IPv4."""
    try:
        ip = ipaddress.ip_address(peer_host(peer))
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _networks(items: Iterable[str]) -> tuple[Network, ...]:
    return tuple(parse_network(s) for s in items)


def describe(networks: Sequence[Network]) -> str:
    return ", ".join(str(n) for n in networks) or "nowhere"


class Backoff:
    """Per-address delay before a HELLO is read, after failed authentications from that
    address: 50 ms after the first failure, doubling per failure up to ``ceiling``; an
    address with no failure for ``forget`` seconds starts over. Connections from one address
    wait one behind the other, so opening many in parallel does not multiply the guesses."""

    FIRST = 0.05

    def __init__(self, ceiling: float, forget: float = 60.0, max_addresses: int = 65536) -> None:
        self.ceiling = ceiling
        self.forget = forget
        self.max_addresses = max_addresses
        # ip -> (failures, time of the last failure, earliest time the next HELLO is read)
        self._state: dict[str, tuple[int, float, float]] = {}

    def failed(self, ip: str, now: float) -> None:
        if not self.ceiling:
            return
        n, last, nxt = self._state.get(ip, (0, now, now))
        if now - last > self.forget:
            n, nxt = 0, now
        if len(self._state) >= self.max_addresses and ip not in self._state:
            self._prune(now)
        self._state[ip] = (n + 1, now, max(nxt, now))

    def succeeded(self, ip: str) -> None:
        self._state.pop(ip, None)

    def delay(self, ip: str, now: float) -> float:
        """How long a new connection from ``ip`` waits before its HELLO is read (and books
        its turn, so the next one waits behind it)."""
        st = self._state.get(ip)
        if st is None:
            return 0.0
        n, last, nxt = st
        if now - last > self.forget:
            del self._state[ip]
            return 0.0
        step: float = min(self.ceiling, self.FIRST * 2.0 ** min(n - 1, 32))
        at = max(now, nxt) + step
        self._state[ip] = (n, last, at)
        return at - now

    def _prune(self, now: float) -> None:
        for ip, (_n, last, _nxt) in list(self._state.items()):
            if now - last > self.forget:
                del self._state[ip]
        while len(self._state) >= self.max_addresses:  # still full: forget the oldest
            del self._state[next(iter(self._state))]
