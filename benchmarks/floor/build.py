"""Build the light-load floors with the system C compiler: ``benchmarks/floor/relay.c`` (with
``mqtt.c`` for its federated mode) and ``benchmarks/floor/threads.c``.

    python benchmarks/floor/build.py [--out FILE] [--threads-out FILE]

prints the paths of the built ``floor-relay`` and ``floor-threads`` binaries (default
``build/floor-relay`` and ``build/floor-threads``, which git ignores; the binaries are never
committed). Each is rebuilt only when one of its sources is newer than it.
``benchmarks/bench_vs_jgroups.py`` runs them as the ``floor`` and ``floor-threads`` routers:
``floor-relay PORT`` and ``floor-threads PORT`` listen on 127.0.0.1:PORT only;
``benchmarks/bench_federation_floor.py`` runs the first federated, ``floor-relay PORT
BROKER_PORT ID``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
HERE = Path(__file__).resolve().parent
SOURCE = HERE / "relay.c"
# Compiled with relay.c; the headers only count for the rebuild.
SOURCES = (SOURCE, HERE / "mqtt.c")
HEADERS = (HERE / "mqtt.h", HERE / "msgpack.h", HERE / "frames.h", HERE / "listen.h")
DEFAULT_OUT = ROOT / "build" / "floor-relay"
# The floor with a blocked reader thread per connection (Java 5.x's threading).
THREADS_SOURCES = (HERE / "threads.c",)
THREADS_HEADERS = (HERE / "msgpack.h", HERE / "frames.h", HERE / "listen.h")
THREADS_OUT = ROOT / "build" / "floor-threads"
CFLAGS = ("-O2", "-std=c11", "-Wall", "-Wextra", "-Werror")


def built(out: Path = DEFAULT_OUT) -> Path:
    """The floor binary, compiled first if it is missing or older than a source; SystemExit
    with the cause (no compiler, or the compiler's own message) when it cannot be built."""
    return _built(out, SOURCES, HEADERS, ())


def built_threads(out: Path = THREADS_OUT) -> Path:
    """The thread-per-connection floor's binary (threads.c), as :func:`built`."""
    return _built(out, THREADS_SOURCES, THREADS_HEADERS, ("-pthread",))


def _built(out: Path, sources: tuple[Path, ...], headers: tuple[Path, ...],
           flags: tuple[str, ...]) -> Path:
    if out.exists() and out.stat().st_mtime >= max(p.stat().st_mtime
                                                   for p in (*sources, *headers)):
        return out
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise SystemExit(f"floor build: no C compiler '{cc}' on PATH (install gcc, or set CC)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")  # two test runs may build at once
    done = subprocess.run([cc, *CFLAGS, *flags, "-o", str(tmp), *map(str, sources)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"floor build: {cc} failed on {sources[0].relative_to(ROOT)}:\n"
                         f"{done.stderr.strip()}")
    tmp.replace(out)  # atomic: a concurrent run never executes a half-written binary
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build the C floor relays into build/.")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT,
                    help="the single-threaded epoll floor's binary (relay.c)")
    ap.add_argument("--threads-out", type=Path, default=THREADS_OUT,
                    help="the thread-per-connection floor's binary (threads.c)")
    args = ap.parse_args(argv)
    print(built(args.out))
    print(built_threads(args.threads_out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
