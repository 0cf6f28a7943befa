"""Other routers out of reach, held in grace (docs/federation.md, "Failures"): the part of
:class:`gossiprouter.federation.state.Federation` that decides when a lost router's members go.

A router is lost by its Last Will, by a resync that does not see it, by this router being
cut off from the broker, or by its heartbeats stopping (:mod:`gossiprouter.federation.liveness`).
With a grace (``federation_grace``) its members stay in the table until the grace runs out
(:meth:`Graces.tick`: then they are suspected); its presence or heartbeats coming back before
that revive it, and nothing changed for them. Sans-IO, like the state it is part of.

The federation's timed work is here too: :meth:`Graces.next_due` says when :meth:`Graces.tick`
has something to do (the I/O side's ticker sleeps until then, woken by ``wake`` when a new
deadline is set), and a tick also ends the holds of :mod:`gossiprouter.federation.moves`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gossiprouter.routing.entries import Notice

if TYPE_CHECKING:
    from gossiprouter.federation.moves import Moves

log = logging.getLogger("gossiprouter.federation.state")

# A router seen again after a resync has this long (at most its grace) to publish its records
# again before the groups it did not publish are dropped as ghosts: they follow its presence on
# one connection, so seconds are plenty, but a resync's end can fall between the two.
GHOST_SETTLE = 5.0


class Graces:
    """The grace of lost routers (see the module docstring); a base of Federation, which
    holds the attributes and the two methods declared here."""

    routers: dict[str, Any]  # origin -> RemoteRouter
    grace: float
    synced: bool
    epoch: int
    stats: Any  # FederationStats
    hub: Any  # Hub
    routing_changed: Callable[[], None]  # (state.Federation: the relay thread's link)
    wake: Callable[[], None]  # (state.Federation: a deadline of tick() was set)
    moves: Moves  # (its holds have deadlines too)

    def _drop_router(self, r: Any, suspect: bool = True) -> list[Notice]:
        raise NotImplementedError

    def _apply(self, r: Any, group: str, members: list[Any],
               suspected: set[bytes]) -> list[Notice]:
        raise NotImplementedError

    def graced_routers(self) -> int:
        return sum(1 for r in self.routers.values() if r.grace_until is not None)

    def _drop_ghosts(self, r: Any) -> list[Notice]:
        """The groups of ``r`` not published again in this broker session."""
        r.ghost_check_at = None
        notices: list[Notice] = []
        for group in list(r.groups):
            if r.record_epochs.get(group, 0) < self.epoch:
                self.stats.ghosts_removed += len(r.groups[group])
                notices += self._apply(r, group, [], set())
        return notices

    def cut_off(self, now: float = 0.0) -> None:
        """This router lost the broker: the others are lost too (held in grace from
        ``now`` if there is one, else their members are suspected at once)."""
        notices: list[Notice] = []
        for r in list(self.routers.values()):
            notices += self._lose(r, now)
        self.hub.deliver(notices)

    def _lose(self, r: Any, now: float) -> list[Notice]:
        """Router ``r`` is gone for now (Last Will, not seen at a resync, this router cut
        off): dropped at once without a grace, else held until ``now`` + grace."""
        if self.grace <= 0 or not r.alive:
            return self._drop_router(r)
        if r.grace_until is None:
            self.routing_changed()
            r.grace_until = now + self.grace
            self.wake()
            self.stats.routers_graced += 1
            log.info("federation: router %s is out of reach: its members are held for %gs",
                     r.label, self.grace)
        return []

    def unreachable(self, origin: str, now: float) -> None:
        """No heartbeat from ``origin`` for the peer timeout (a cut between brokers): lost
        like a router whose Last Will came, held in grace first."""
        r = self.routers.get(origin)
        if r is not None:
            self.hub.deliver(self._lose(r, now))

    def reachable(self, origin: str, now: float) -> bool:
        """``origin`` is heard from again: revived if held in grace. False when it is not
        known here (dropped meanwhile: its retained state must be read again)."""
        r = self.routers.get(origin)
        if r is None or not r.alive:
            return False
        if r.grace_until is not None:
            self.routing_changed()
            r.grace_until = None
            self.stats.routers_revived += 1
            log.info("federation: router %s is reachable again within its grace", r.label)
        return True

    def next_due(self) -> float | None:
        """When :meth:`tick` has something to do next: the earliest end of a grace, of a
        ghost check's settling time once synced (a check waits for the resync's end, which
        wakes the ticker) or of a move's hold; None: nothing pending."""
        due = self.moves.next_due()
        for r in self.routers.values():
            for at in (r.grace_until, r.ghost_check_at if self.synced else None):
                if at is not None and (due is None or at < due):
                    due = at
        return due

    def tick(self, now: float) -> None:
        """The routers whose grace ran out are dropped (their members suspected); the ghost
        checks that are due are made; the frames held for members that left past their bound
        are dropped (:meth:`gossiprouter.federation.moves.Moves.expire`)."""
        notices: list[Notice] = []
        for r in list(self.routers.values()):
            if r.grace_until is not None and r.grace_until <= now:
                log.warning("federation: router %s did not come back within %gs: dropped",
                            r.label, self.grace)
                notices += self._drop_router(r)
            elif r.ghost_check_at is not None and r.ghost_check_at <= now and self.synced:
                notices += self._drop_ghosts(r)
        self.hub.deliver(notices)
        self.moves.expire(now)
