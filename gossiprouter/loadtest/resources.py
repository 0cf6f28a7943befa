"""The environment of a load-test run: the router's settings, and the CPU and memory of
the router and the peers over time, with the host's load average.

On a shared machine a bad p99 is as often the neighbours' doing as the router's: the
report sets the latency beside what the machine was doing. The router tells its own
figures on its metrics port (``process_cpu_seconds_total``,
``process_resident_memory_bytes`` and ``gossiprouter_settings_info``, see
:mod:`gossiprouter.ops.metrics`); the loader scrapes them about once a second
(:func:`scrape_router`). The peers tell theirs in their counters (:func:`own_usage`).
:class:`ResourceSampler` keeps the samples, bounded: past ``max_samples`` every other
one is dropped and the interval doubled, so a long run is covered end to end in the
same space. It all goes to the manifest's ``resources``, which the report draws.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Final

import trio

import gossiprouter

__all__ = ["MAX_SAMPLES", "ResourceSampler", "RouterScrape", "host_facts", "metrics_available",
           "metrics_option", "own_usage", "parse_metrics", "scrape_router"]

MAX_SAMPLES: Final = 600
SCRAPE_TIMEOUT: Final = 2.0
MAX_METRICS_BYTES: Final = 4 << 20


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def host_facts() -> dict[str, Any]:
    """Versions and machine facts for the manifest."""
    return {
        "versions": {
            "gossiprouter": gossiprouter.__version__,
            "python": platform.python_version(),
            "python_implementation": platform.python_implementation(),
            "trio": trio.__version__,
            "pyarrow": _version("pyarrow"),
            "msgpack": _version("msgpack"),
            "rich": _version("rich"),
        },
        "host": {
            "hostname": platform.node(),
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cores": os.cpu_count(),
            "memory_bytes": _memory_bytes(),
        },
    }


def own_usage() -> tuple[float, int | None]:
    """(CPU seconds, user and system, of this process so far; resident memory in bytes,
    None where /proc is not there)."""
    cpu = time.process_time()
    try:
        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read().split()[1])
        return cpu, pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        # No /proc (not Linux): getrusage would give the peak, not the current size.
        return cpu, None


def host_load() -> float | None:
    """The host's one-minute load average (None where the system has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


@dataclass
class RouterScrape:
    """What one scrape of a router's /metrics gave."""

    cpu_s: float | None = None
    rss_bytes: int | None = None
    settings: dict[str, str] = field(default_factory=dict)


def parse_metrics(text: str) -> RouterScrape:
    """The process figures and settings of a router from its Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    out = RouterScrape()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "process_cpu_seconds_total":
                out.cpu_s = float(s.value)
            elif s.name == "process_resident_memory_bytes":
                out.rss_bytes = int(s.value)
            elif s.name == "gossiprouter_settings_info":
                out.settings = dict(s.labels)
    return out


def scrape_router(address: str, timeout: float = SCRAPE_TIMEOUT) -> RouterScrape | None:
    """Scrape ``http://ADDRESS/metrics`` (blocking: run it in a thread); None when the
    router does not answer (down for a restart, say) or prometheus-client is missing."""
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as r:
            body = r.read(MAX_METRICS_BYTES)
        return parse_metrics(body.decode("utf-8", errors="replace"))
    except (OSError, urllib.error.URLError, ValueError, ImportError):
        return None


def metrics_option(args: tuple[str, ...]) -> str | None:
    """The ``--metrics HOST:PORT`` among the router's arguments, if any."""
    for i, a in enumerate(args):
        if a == "--metrics" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--metrics="):
            return a.split("=", 1)[1]
    return None


def metrics_available() -> bool:
    """Whether a router started from this Python can serve /metrics (prometheus-client)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class ResourceSampler:
    """Samples of the run's processes, at most ``max_samples`` of them."""

    interval_s: float = 1.0
    max_samples: int = MAX_SAMPLES
    samples: list[dict[str, Any]] = field(default_factory=list)
    router_settings: dict[str, str] = field(default_factory=dict)

    def add(self, t_s: float, processes: dict[str, tuple[float | None, int | None]],
            taken_s: dict[str, float] | None = None) -> None:
        """One sample (the caller waits ``interval_s`` before the next): ``processes``
        maps a name ("router", "p0", ...) to (CPU seconds so far, resident bytes);
        ``taken_s`` when a process's figures are older than ``t_s`` (a peer's last
        counters), so its CPU rate is over the right interval. The host's load average
        is taken here."""
        taken = taken_s or {}
        procs: dict[str, dict[str, Any]] = {}
        for k, (cpu, rss) in processes.items():
            procs[k] = {"cpu_s": None if cpu is None else round(cpu, 3), "rss_bytes": rss}
            if k in taken:
                procs[k]["t_s"] = round(taken[k], 3)
        self.samples.append({"t_s": round(t_s, 3), "load1": host_load(), "processes": procs})
        if len(self.samples) >= self.max_samples:
            # Keep the whole run in the same space: every other sample, twice as sparse.
            self.samples = self.samples[::2]
            self.interval_s *= 2

    def to_manifest(self) -> dict[str, Any]:
        """The manifest's ``resources``: ``cores``, ``interval_s``, ``router_settings``
        and ``samples``; the report reads these keys."""
        return {"cores": os.cpu_count(), "interval_s": self.interval_s,
                "router_settings": self.router_settings, "samples": self.samples}

