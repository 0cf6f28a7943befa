"""The driver's side of the attacks: the router options they need, and the attack process.

:class:`AttackRunner` tells the driver which options its router needs (``admin-poll`` needs
the HTTP endpoint: ``--metrics`` on a free port when the driver spawns the router), then
runs the attack process (:func:`command`, started with :func:`block_sigterm`) for the sending
phase and says what it did, from the counters it wrote (:data:`ATTACKS_FILE`).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import trio

from gossiprouter.loadtest.attacks.spec import AttackSpec, MiB
from gossiprouter.loadtest.resources import metrics_option

__all__ = ["ATTACKS_FILE", "AttackRunner", "block_sigterm", "command", "describe"]

ATTACKS_FILE: Final = "attacks.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class AttackRunner:
    """What the driver needs: extra router options, and the attack process for the run."""

    def __init__(self, attacks: tuple[AttackSpec, ...], run_dir: Path, *,
                 router_args: tuple[str, ...], spawned: bool) -> None:
        self.attacks = attacks
        self.run_dir = run_dir
        self.metrics: str | None = None
        self.router_args: tuple[str, ...] = ()
        self.warnings: list[str] = []
        if not any(a.kind == "admin-poll" for a in attacks):
            return
        self.metrics = metrics_option(router_args)
        if self.metrics is None and spawned:
            self.metrics = f"127.0.0.1:{_free_port()}"
            self.router_args = ("--metrics", self.metrics)
        elif self.metrics is None:
            self.warnings.append("admin-poll attack skipped: the router's --metrics address "
                                 "is unknown (give it in router.args, or use --spawn-router)")

    @property
    def active(self) -> bool:
        return bool(self.attacks)

    async def run(self, router: str, t0_ns: int, end_ns: int,
                  say: Callable[[str], None]) -> None:
        """Run the attack process from ``t0_ns`` to ``end_ns``; never raises (an attacker
        that fails is reported, the honest run goes on)."""
        config = self.run_dir / "logs" / "attacks-config.json"
        config.write_text(json.dumps({
            "router": router, "metrics": self.metrics, "t0_ns": t0_ns, "end_ns": end_ns,
            "out": str(self.run_dir / ATTACKS_FILE),
            "attacks": [a.to_dict() for a in self.attacks]}))
        say(f"{len(self.attacks)} attacks start with sending: "
            + ", ".join(a.kind for a in self.attacks))
        with open(self.run_dir / "logs" / "attacks.log", "ab") as logf:
            result = await trio.run_process(
                command(config), stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                check=False, preexec_fn=block_sigterm)
        if result.returncode != 0:
            say(f"the attack process exited with status {result.returncode} (see logs/"
                "attacks.log)")
            return
        try:
            summary = json.loads((self.run_dir / ATTACKS_FILE).read_text())
        except (OSError, ValueError):
            return
        say("attacks done: " + "; ".join(describe(a) for a in summary.get("attacks", [])))


def command(config: Path) -> list[str]:
    """The attack process for ``config``; start it with ``preexec_fn=block_sigterm``."""
    return [sys.executable, "-m", "gossiprouter.loadtest.attacks", str(config)]


def block_sigterm() -> None:
    """``preexec_fn`` of the attack process: SIGTERM stays pending until main() has a
    handler, so a driver that stops the process while Python is still importing does not
    kill it before it writes attacks.json (the mask is inherited across exec)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def describe(a: Mapping[str, Any]) -> str:
    """One attack's result (kind and counters, as the attack process writes them) in a line."""
    c = a.get("counters", {})
    text = (f"{a.get('kind')}: {c.get('opened', 0)} connections, "
            f"{c.get('closed_by_router', 0)} closed by the router, "
            f"{c.get('bytes_out', 0) / MiB:.1f} MiB out")
    if a.get("kind") == "admin-poll":
        text += (f", {c.get('answers', 0)} answers (slowest {c.get('slowest_s', 0.0):.2f} s), "
                 f"{c.get('failures', 0)} failures")
    if c.get("refused"):
        text += f", {c['refused']} refused"
    return text
