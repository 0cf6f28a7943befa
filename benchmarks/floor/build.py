"""Build the light-load floor (``benchmarks/floor/relay.c``, with ``mqtt.c`` for its federated
mode) with the system C compiler.

    python benchmarks/floor/build.py [--out FILE]

prints the path of the built ``floor-relay`` binary (default ``build/floor-relay``, which git
ignores; the binary is never committed). Rebuilt only when a source is newer than it.
``benchmarks/bench_vs_jgroups.py`` runs it as the ``floor`` router: ``floor-relay PORT``
listens on 127.0.0.1:PORT only; ``benchmarks/bench_federation_floor.py`` runs it federated,
``floor-relay PORT BROKER_PORT ID``.
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
HEADERS = (HERE / "mqtt.h", HERE / "msgpack.h")
DEFAULT_OUT = ROOT / "build" / "floor-relay"
CFLAGS = ("-O2", "-std=c11", "-Wall", "-Wextra", "-Werror")


def built(out: Path = DEFAULT_OUT) -> Path:
    """The floor binary, compiled first if it is missing or older than a source; SystemExit
    with the cause (no compiler, or the compiler's own message) when it cannot be built."""
    if out.exists() and out.stat().st_mtime >= max(p.stat().st_mtime
                                                   for p in (*SOURCES, *HEADERS)):
        return out
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise SystemExit(f"floor build: no C compiler '{cc}' on PATH (install gcc, or set CC)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")  # two test runs may build at once
    done = subprocess.run([cc, *CFLAGS, "-o", str(tmp), *map(str, SOURCES)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"floor build: {cc} failed on {SOURCE.relative_to(ROOT)}:\n"
                         f"{done.stderr.strip()}")
    tmp.replace(out)  # atomic: a concurrent run never executes a half-written binary
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build the C floor relay into build/.")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="binary to write")
    args = ap.parse_args(argv)
    print(built(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
