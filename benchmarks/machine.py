"""The machine's state that decides a benchmark's latencies at light load, for every benchmark:
its CPU idle driver (:func:`cpu_idle`), and the CPU latency request a run may hold
(:func:`cpu_latency`; docs/performance.md, "The C floor, in the same run", and
docs/operations.md, "Latency at light load")."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The kernel's CPU latency request (PM QoS): while a process holds it open with a value written,
# no idle CPU enters a state slower to leave than that many microseconds.
CPU_DMA_LATENCY = Path("/dev/cpu_dma_latency")
CPUIDLE = Path("/sys/devices/system/cpu/cpuidle")


def cpu_idle() -> str:
    """The idle driver and governor (e.g. ``haltpoll/haltpoll`` in a KVM guest, where an idle
    vCPU polls for a while and then halts, and waking a halted one costs an exit to the host):
    what decides a wake-up's latency at light load."""
    try:
        return "/".join((CPUIDLE / f).read_text().strip()
                        for f in ("current_driver", "current_governor_ro"))
    except OSError:
        return "n/a"


@contextmanager
def cpu_latency(us: int | None, device: Path = CPU_DMA_LATENCY) -> Iterator[None]:
    """With ``us`` (not None): no CPU of the machine idles in a state slower to leave than
    ``us`` microseconds while the block runs (0: idle CPUs poll, never halt), held through
    ``device``; SystemExit with the cause when it cannot be opened (it needs root). A setting of
    the whole machine, for benchmarks: the CPU an idle core spends polling is nobody's process
    time, so it shows in no figure here."""
    if us is None:
        yield
        return
    try:
        fd = os.open(device, os.O_WRONLY)
    except OSError as e:
        raise SystemExit(f"--cpu-latency-us: cannot open {device} ({e.strerror}; it needs root)"
                         ) from None
    try:
        os.write(fd, us.to_bytes(4, sys.byteorder, signed=True))
        yield
    finally:
        os.close(fd)  # the request ends with its file


def add_cpu_latency_option(ap: argparse.ArgumentParser) -> None:
    """``--cpu-latency-us US`` on a benchmark's command line (``args.cpu_latency_us``: None when
    not given), for :func:`cpu_latency`."""
    ap.add_argument("--cpu-latency-us", type=_microseconds, default=None, metavar="US",
                    help="hold the machine's CPU latency request (/dev/cpu_dma_latency, root) at "
                         "US while running: 0 keeps idle CPUs polling instead of halting, which "
                         "takes their wake-up out of every latency (docs/performance.md)")


def _microseconds(text: str) -> int:
    try:
        us = int(text)
    except ValueError:
        us = -1
    if us < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more microseconds, got {text!r}")
    return us
