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

from gossiprouter.config import Config, parse_network

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


def peer_ip(peer: str) -> IPAddress | None:
    """The IP of a ``host:port`` peer string; IPv4-mapped IPv6 counts as IPv4."""
    host = peer.rpartition(":")[0].strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _networks(items: Iterable[str]) -> tuple[Network, ...]:
    return tuple(parse_network(s) for s in items)


def describe(networks: Sequence[Network]) -> str:
    return ", ".join(str(n) for n in networks) or "nowhere"
