"""The timed events of a load-test run: what the driver does at ``t0 + at`` for each one.

Step 4 of :mod:`gossiprouter.loadtest.driver`: :class:`EventPlayer` plays ``leave`` and
``join`` through the member's peer, ``kill`` as freeze, ``killed`` in the membership
timeline, then SIGKILL (so the audit stays exact), and ``restart-router`` as a stop, ``down``
seconds of outage and a start on the same port, after which it watches in the background
until every member is registered again. Every event played is added, with its times on the
run's monotonic clock, to the manifest's ``events``.
"""

from __future__ import annotations

import signal
import time
from typing import Any, Final

import trio

from gossiprouter.loadtest.errors import LoadTestError
from gossiprouter.loadtest.processes import PeerProcess, SpawnedRouter, wait_exit
from gossiprouter.loadtest.progress import Progress
from gossiprouter.loadtest.records import MembershipWriter
from gossiprouter.loadtest.scenario import Event, Scenario
from gossiprouter.stub import RouterStub, StubError

__all__ = ["EventPlayer"]

FREEZE_TIMEOUT: Final = 5.0
KILL_WAIT: Final = 5.0
# After a router restart: how long to watch for every member to be registered again, and
# how often to ask. Bounded so that a stub that never comes back cannot stall the run.
REREGISTER_TIMEOUT: Final = 30.0
REREGISTER_POLL: Final = 0.05


class EventPlayer:
    """Plays the timed events of one run on its processes and routers.

    ``played`` (the manifest's ``events``), ``warnings`` and ``killed`` (process numbers)
    are the run's own lists: the player adds to them.
    """

    def __init__(self, scenario: Scenario, peers: list[PeerProcess],
                 routers: list[SpawnedRouter], addresses: list[str], *, federated: bool,
                 membership: MembershipWriter, progress: Progress,
                 played: list[dict[str, Any]], warnings: list[str], killed: list[int]) -> None:
        self.s = scenario
        self.peers = peers
        self.routers = routers
        self.addresses = addresses
        self.federated = federated
        self.membership = membership
        self.progress = progress
        self.played = played
        self.warnings = warnings
        self.killed = killed

    async def play(self, nursery: trio.Nursery, ev: Event) -> None:
        """Play ``ev`` now (its time has come) and add it to the events played."""
        say = self.progress.log
        played: dict[str, Any] = {"at": ev.at, "action": ev.action, "what": ev.describe(),
                                  "t_ns": time.monotonic_ns()}
        self.played.append(played)
        if ev.action in ("leave", "join"):
            assert ev.member is not None
            member = self.s.member(ev.member)
            peer = self.peers[member.proc]
            reply = await peer.request({"cmd": ev.action, "member": ev.member},
                                       timeout=self.s.stub.send_timeout + 10)
            if reply is None or not reply.get("ok"):
                why = "no reply" if reply is None else reply.get("error")
                self.warnings.append(f"event at {ev.at:g} s ({ev.describe()}) failed: {why}")
                say(f"{ev.describe()}: FAILED ({why})")
            else:
                say(f"{ev.describe()} (process {member.proc})")
        elif ev.action == "kill":
            assert ev.process is not None
            await self._kill(self.peers[ev.process])
        else:
            router = self.routers[ev.router]
            if self.federated:
                # Its outage cuts only the pairs with an end on it (the audit reads these).
                played["router"] = ev.router
                played["members"] = [m.name for m in self.s.members if m.router == ev.router]
            sig = signal.SIGKILL if ev.signal == "KILL" else signal.SIGTERM
            say(f"{ev.describe()}: stopping")
            await router.restart(nursery, sig, ev.down)
            played["up_ns"] = time.monotonic_ns()
            say("router restarted")
            # Watched in the background: the next event must not wait for the stubs.
            played["registered_ns"] = None
            nursery.start_soon(self._watch_reregistration, played)

    def _registered_now(self) -> dict[str, int]:
        """Members per group that should be registered now (joined, in a live process)."""
        counts: dict[str, int] = {}
        for p in self.peers:
            if p.proc_no not in self.killed:
                for group in p.joined.values():
                    counts[group] = counts.get(group, 0) + 1
        return counts

    async def _watch_reregistration(self, played: dict[str, Any]) -> None:
        """Record in ``played`` when every member is registered with the router again.

        The audit counts a delivery lost between the router going down and this moment as
        lost across a reconnect; without it, it could only guess how long the stubs took.
        """
        deadline = trio.current_time() + REREGISTER_TIMEOUT
        with trio.move_on_at(deadline):
            # The restarted router: with a federation its answer includes the other
            # routers' members too, so this also waits for its membership to be resynced.
            address = self.addresses[int(played.get("router", 0))]
            async with RouterStub([address], connect_timeout=1.0, request_timeout=1.0,
                                  send_timeout=1.0, reconnect_initial=REREGISTER_POLL,
                                  reconnect_max=0.5) as stub:
                while True:
                    want = self._registered_now()
                    try:
                        have = {g: len(await stub.members(g)) for g in want}
                    except StubError:
                        have = {}
                    if all(have.get(g, 0) >= n for g, n in want.items()):
                        played["registered_ns"] = time.monotonic_ns()
                        self.progress.log(
                            "every member registered again "
                            f"{(played['registered_ns'] - played['up_ns']) / 1e9:.2f} s after "
                            "the restart")
                        return
                    await trio.sleep(REREGISTER_POLL)
        self.warnings.append(f"after the router restart at {played['at']:g} s not every member "
                             f"was registered again within {REREGISTER_TIMEOUT:g} s")

    async def _kill(self, peer: PeerProcess) -> None:
        say = self.progress.log
        # Freeze first: the peer stops recording and sending and writes every row it has, so
        # the SIGKILL below loses nothing and the audit can be exact.
        reply = await peer.request({"cmd": "freeze"}, timeout=FREEZE_TIMEOUT)
        if reply is None:
            self.warnings.append(f"process {peer.proc_no} did not confirm the freeze within "
                                 f"{FREEZE_TIMEOUT:g} s; killed anyway (rows it had not "
                                 "flushed are lost)")
        # Taken after the freeze and before the signal: no record of the process is later.
        t = time.monotonic_ns()
        for member, group in sorted(peer.joined.items()):
            self.membership.killed(group, member, t)
        self.membership.flush()
        peer.expected_exit = True
        peer.state = "killed"
        peer.rates = (0.0, 0.0)
        members = len(peer.joined)
        peer.joined.clear()
        self.killed.append(peer.proc_no)
        assert peer.process is not None
        peer.process.kill()  # SIGKILL: the router sees the connections drop, no DISCONNECT
        if not await wait_exit(peer.process, KILL_WAIT):
            raise LoadTestError(f"peer process {peer.proc_no} survived SIGKILL for "
                                f"{KILL_WAIT:g} s")
        say(f"killed process {peer.proc_no} ({members} members)")
