"""The operations layer's own counters: what the hooks admitted, refused and reloaded.

:class:`.runtime.Operations` counts into one :class:`OpsStats`; :mod:`.metrics` reads it at
scrape time. It lives here, below both, so that the metrics name the counters they read
without importing the hooks that keep them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OpsStats:
    accepted: dict[str, int] = field(default_factory=dict)
    # (protocol or "any", reason) -> count
    refused: dict[tuple[str, str], int] = field(default_factory=dict)
    # (what, "ok" / "failed") -> count
    reloads: dict[tuple[str, str], int] = field(default_factory=dict)
    # Native connections whose HELLO was held back after failed authentications.
    auth_delayed: int = 0

    def bump(self, table: dict[tuple[str, str], int], key: tuple[str, str]) -> None:
        table[key] = table.get(key, 0) + 1
