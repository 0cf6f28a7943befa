"""The registrar's plan: what one connection must be sent to hold what the stub wants.

Pure: no trio, no sockets. :func:`plan` compares what the stub wants (its channels in creation
order, the groups it watches, each channel's topic patterns) with what one connection holds
on its router (:class:`Held`), updates ``Held`` as if every request were already written, and
returns the requests as :class:`Step` values, in the order they must go out:

1. DISCONNECT for every channel the stub closed (the channel moves to ``leaving`` until the
   router answers);
2. UNWATCH for every group no longer watched (sorted);
3. CONNECT for every channel the connection does not hold, in creation order (on a fresh
   connection: all of them, which is the re-registration after a reconnect); a channel this
   router refused is not asked again;
4. WATCH for every watched group the connection does not watch;
5. UNSUBSCRIBE / SUBSCRIBE so the connection holds each registered channel's patterns (after
   the CONNECTs: a router accepts SUBSCRIBE only from a member).

The registrar task (:mod:`gossiprouter.client.link`) turns steps into frames, writes them and
applies the answers (a refused CONNECT moves the channel to ``refused``; an accepted SUBSCRIBE
to ``sub_acked``). Tested table-driven in tests/test_client_registrar.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypeVar

from gossiprouter.client.model import Key
from gossiprouter.core.topics import TopicId


class Registrable(Protocol):
    """What the plan needs to know of a channel (Channel is one)."""

    @property
    def group(self) -> str: ...

    @property
    def addr(self) -> bytes: ...

    @property
    def subscriptions(self) -> frozenset[TopicId]: ...


C = TypeVar("C", bound=Registrable)

StepKind = Literal["disconnect", "unwatch", "connect", "watch", "unsubscribe", "subscribe"]


@dataclass
class Held(Generic[C]):
    """What one connection holds on its router, as far as the requests written say."""

    registered: dict[Key, C] = field(default_factory=dict)  # CONNECT written, not withdrawn
    routable: set[C] = field(default_factory=set)  # CONNECT written: ROUTE frames may follow
    refused: dict[Key, C] = field(default_factory=dict)  # the router refused this CONNECT
    leaving: set[C] = field(default_factory=set)  # DISCONNECT written, not yet answered
    watching: set[str] = field(default_factory=set)  # WATCH written
    watch_acked: set[str] = field(default_factory=set)  # WATCH answered OK
    # Topic patterns per channel: SUBSCRIBE written, and answered OK.
    subscribed: dict[Key, set[TopicId]] = field(default_factory=dict)
    sub_acked: dict[Key, set[TopicId]] = field(default_factory=dict)

    def refuse(self, key: Key, ch: C) -> None:
        """The router refused ``ch``'s CONNECT: it holds nothing of it, and the plan does not
        ask again while ``ch`` is the stub's channel for ``key``."""
        if self.registered.get(key) is ch:
            del self.registered[key]
        self.routable.discard(ch)
        self.refused[key] = ch


@dataclass(frozen=True)
class Step(Generic[C]):
    """One request to write. ``channel`` is set for (dis)connect and (un)subscribe, ``group``
    for (un)watch, ``pattern`` for (un)subscribe."""

    kind: StepKind
    channel: C | None = None
    group: str = ""
    pattern: TopicId | None = None


def plan(held: Held[C], channels: Mapping[Key, C], watched: Set[str]) -> list[Step[C]]:
    """The requests that bring ``held`` in line with ``channels`` (creation order) and
    ``watched``; ``held`` is updated as if they were all written."""
    steps: list[Step[C]] = []
    for key, ch in list(held.registered.items()):
        if key not in channels:
            del held.registered[key]
            held.routable.discard(ch)
            held.leaving.add(ch)
            steps.append(Step("disconnect", ch))
    for key, ch in list(held.refused.items()):
        if channels.get(key) is not ch:
            del held.refused[key]  # closed, or replaced by a new channel: ask again
    for g in sorted(held.watching - watched):
        held.watching.discard(g)
        held.watch_acked.discard(g)
        steps.append(Step("unwatch", group=g))
    for key, ch in channels.items():
        if held.registered.get(key) is not ch and held.refused.get(key) is not ch:
            held.registered[key] = ch
            steps.append(Step("connect", ch))
    for g in watched:
        if g not in held.watching:
            held.watching.add(g)
            steps.append(Step("watch", group=g))
    steps += _plan_topics(held)
    return steps


def _plan_topics(held: Held[C]) -> list[Step[C]]:
    steps: list[Step[C]] = []
    for key in [k for k in held.subscribed if held.registered.get(k) is None]:
        del held.subscribed[key]  # DISCONNECT (or refusal) dropped them on the router
        held.sub_acked.pop(key, None)
    for key, ch in held.registered.items():
        sent = held.subscribed.setdefault(key, set())
        wanted = ch.subscriptions
        for pat in sorted(sent - wanted):
            sent.discard(pat)
            held.sub_acked.get(key, set()).discard(pat)
            steps.append(Step("unsubscribe", ch, pattern=pat))
        for pat in sorted(wanted - sent):
            sent.add(pat)
            steps.append(Step("subscribe", ch, pattern=pat))
    return steps
