"""The attack process: every attack of the run, from the start of sending to its end.

``python -m gossiprouter.loadtest.attacks CONFIG`` (started by
:class:`~gossiprouter.loadtest.attacks.runner.AttackRunner`) reads the JSON ``CONFIG`` the
driver wrote (router, metrics address, ``t0_ns``, ``end_ns``, the ``[[attacks]]`` tables and
where to write the counters), runs one hostile client per table (:data:`_CLASSES`) from
``t0_ns`` to ``end_ns`` on the time.monotonic_ns clock, or until SIGTERM, and on any exit
writes every attack's counters.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any, Final

import trio

from gossiprouter.loadtest.attacks.admin_poll import AdminPoll
from gossiprouter.loadtest.attacks.base import Attack
from gossiprouter.loadtest.attacks.flood import Flood
from gossiprouter.loadtest.attacks.huge_names import HugeNames
from gossiprouter.loadtest.attacks.partial_frames import PartialFrames
from gossiprouter.loadtest.attacks.runner import describe
from gossiprouter.loadtest.attacks.spec import parse_attacks
from gossiprouter.loadtest.attacks.watch_flood import WatchFlood
from gossiprouter.loadtest.pacing import trio_time_at

__all__ = ["main", "run_attacks"]

log = logging.getLogger("gossiprouter.loadtest.attacks")


_CLASSES: Final[dict[str, type[Attack]]] = {
    "ping-flood": Flood, "heartbeat-flood": Flood, "partial-frames": PartialFrames,
    "huge-names": HugeNames, "watch-flood": WatchFlood, "admin-poll": AdminPoll,
}


def _attacks(config: dict[str, Any]) -> list[Attack]:
    host, _, port = str(config["router"]).rpartition(":")
    specs = parse_attacks(config["attacks"], "<driver config>")
    return [_CLASSES[s.kind](s, host, int(port), config.get("metrics")) for s in specs]


def _results(attacks: list[Attack]) -> list[dict[str, Any]]:
    return [{**a.spec.to_dict(), "counters": a.c.__dict__} for a in attacks]


async def run_attacks(config: dict[str, Any], stop_on_sigterm: bool = False,
                      attacks: list[Attack] | None = None) -> list[dict[str, Any]]:
    """Run every attack of ``config`` (or ``attacks``, made from it) from t0_ns to end_ns
    (time.monotonic_ns clock), or until SIGTERM with ``stop_on_sigterm``."""
    attacks = _attacks(config) if attacks is None else attacks
    with trio.move_on_at(trio_time_at(int(config["end_ns"]))) as scope:
        async with trio.open_nursery() as n:
            if stop_on_sigterm:
                await n.start(_stop_on_sigterm, scope)
            await trio.sleep_until(trio_time_at(int(config["t0_ns"])))
            for a in attacks:
                n.start_soon(a.run)
    return _results(attacks)


# Set by main()'s first handler: a SIGTERM that came before trio listened for it.
_early_sigterm = False


def _note_sigterm(signum: int, frame: object) -> None:
    global _early_sigterm
    _early_sigterm = True


async def _stop_on_sigterm(scope: trio.CancelScope, *,
                           task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                           ) -> None:
    """The driver stops the attack process with SIGTERM when a run fails (the router died,
    say): stop attacking, but still write the counters."""
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        task_status.started()
        if not _early_sigterm:
            await signals.__anext__()
        log.warning("SIGTERM: stopping the attacks")
        scope.cancel()


def main() -> None:
    # First of all: from here a SIGTERM is noted, not fatal (block_sigterm held it until now).
    signal.signal(signal.SIGTERM, _note_sigterm)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = json.loads(Path(sys.argv[1]).read_text())
    t = time.monotonic()
    attacks = _attacks(config)
    try:
        trio.run(run_attacks, config, True, attacks)
    finally:
        # On any exit, an attack's failure included: the counters of what was done.
        results = _results(attacks)
        Path(config["out"]).write_text(json.dumps({"attacks": results}, indent=2) + "\n")
    for r in results:
        log.info("%s", describe(r))
    log.info("attacks ran for %.1f s", time.monotonic() - t)
