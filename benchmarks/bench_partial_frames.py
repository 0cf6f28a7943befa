"""Memory a client can pin with partial frames (issue 12, item 3): router RSS, before and after.

A router process is started with a tokens file (``--python`` picks the interpreter, so another
checkout's ``.venv/bin/python`` measures that checkout). Then, for ``--rounds`` rounds, 40
connections each send the native preamble, (``--mode authed``: a valid HELLO, then) a length
prefix of almost 8 MiB and 7 MiB of the frame, and stay open; the router's VmRSS is read, the
connections are closed, and VmRSS is read again 1.5 s later.

A benchmark, not a test: it prints a table and asserts nothing. Compare two checkouts in the
same run, e.g.::

    .venv/bin/python benchmarks/bench_partial_frames.py --python /work/main/.venv/bin/python
    .venv/bin/python benchmarks/bench_partial_frames.py
"""

from __future__ import annotations

import argparse
import hashlib
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.routers import free_port, wait_listening

PREAMBLE = b"GRTR"
TOKEN = "bench-partial-frames-0123456789"
MiB = 1 << 20


def _hello() -> bytes:
    # HELLO [1, [1], "bench", TOKEN] in msgpack (the native codec's layout, spelled out so that
    # the benchmark does not depend on the checkout under test).
    tok = TOKEN.encode()
    body = b"\x94\x01\x91\x01\xa5bench" + bytes([0xA0 | len(tok)]) + tok
    return len(body).to_bytes(4, "big") + body


def _rss_mb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="interpreter of the router")
    ap.add_argument("--mode", choices=("preauth", "authed", "both"), default="both")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=40)
    args = ap.parse_args()
    modes = ("preauth", "authed") if args.mode == "both" else (args.mode,)
    with tempfile.TemporaryDirectory() as tmp:
        tokens = Path(tmp) / "tokens.toml"
        tokens.write_text(f'[[token]]\nidentity = "bench"\nsha256 = '
                          f'"{hashlib.sha256(TOKEN.encode()).hexdigest()}"\ngroups = ["*"]\n')
        tokens.chmod(0o600)
        print(f"router: {args.python}")
        print("| mode | round | MiB sent | RSS with partial frames (MB) | RSS after close (MB) |")
        print("|---|---:|---:|---:|---:|")
        for mode in modes:
            _run(args.python, tokens, mode, args.rounds, args.connections)


def _run(python: str, tokens: Path, mode: str, rounds: int, n: int) -> None:
    port = free_port()
    # cwd: not a checkout, so that ``-m`` imports the interpreter's own gossiprouter.
    proc = subprocess.Popen([python, "-m", "gossiprouter", "serve", "--port", str(port),
                             "--tokens-file", str(tokens), "--log-level", "error"],
                            cwd=tokens.parent)
    try:
        if not wait_listening(proc, port, 20):
            raise SystemExit("the router did not start")
        body = b"\x94" * (7 * MiB)
        for r in range(1, rounds + 1):
            conns: list[socket.socket] = []
            accepted = 0
            for _ in range(n):
                c = socket.create_connection(("127.0.0.1", port), timeout=5)
                conns.append(c)
                try:
                    c.sendall(PREAMBLE)
                    if mode == "authed":
                        c.sendall(_hello())
                        c.recv(65536)  # WELCOME
                    c.sendall((8 * MiB - 16).to_bytes(4, "big"))
                    c.sendall(body)
                    accepted += 7
                except OSError:
                    pass  # refused by the router (preauth limit, budget)
            time.sleep(1.0)
            peak = _rss_mb(proc.pid)
            for c in conns:
                c.close()
            time.sleep(1.5)
            print(f"| {mode} | {r} | {accepted} | {peak} | {_rss_mb(proc.pid)} |", flush=True)
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
