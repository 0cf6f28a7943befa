"""The native connection's protocol state, as a table (sans-IO; after h11's ``_state.py``).

Which frames each side may send, and when, is one table: :data:`TRANSITIONS` maps
(role, state, frame type) to the next state. Both ends keep a :class:`NativeState` and run
every frame through it, the router and the stub alike, so "HELLO first, once", "WELCOME
once" and "a client may not send OK" are written down once instead of as checks scattered
over the session and the stub:

* :meth:`NativeState.receive` for a frame the peer sent: a frame the table refuses raises
  :class:`ProtocolError` (code ``protocol``), the peer's mistake;
* :meth:`NativeState.send` for a frame about to be sent: a refusal raises
  :class:`LocalProtocolError`, a bug in this program (h11's distinction).

Like h11's table, this one knows nothing of which role this program plays: both roles'
rules apply to both ends. There is one connection state, shared by both roles, because the
native protocol has a single handshake (HELLO, then WELCOME) after which both sides speak
freely until the connection closes. Closing (end of stream, or the router closing after an
ERROR whose code closes, docs/protocol.md §8) is :meth:`NativeState.close`, legal in every
state. Frames the router fans out to many connections (ROUTE, PUBLISH, EVENT) are not run
through a receiver's machine one by one: only a connection in ``OPEN`` can hold the
registrations and watches that make it a receiver, and the hot loops keep a plain boolean
in step with the state (see ``NativeSession.ready``).
"""

from __future__ import annotations

from enum import Enum

from gossiprouter.protocol import native_frames as wire
from gossiprouter.protocol.errors import ProtocolError

__all__ = [
    "CLIENT_FRAMES",
    "ROUTER_FRAMES",
    "TRANSITIONS",
    "FrameType",
    "LocalProtocolError",
    "NativeState",
    "Role",
    "State",
    "refusal",
]

FrameType = type[wire.Frame]


class Role(Enum):
    CLIENT = "client"
    ROUTER = "router"


class State(Enum):
    AWAIT_HELLO = "AWAIT_HELLO"  # connected (after the preamble); the client must send HELLO
    AWAIT_WELCOME = "AWAIT_WELCOME"  # HELLO sent; the router answers WELCOME or refuses
    OPEN = "OPEN"  # WELCOME sent: requests, routed traffic, heartbeats
    CLOSED = "CLOSED"  # nothing more is exchanged


class LocalProtocolError(ProtocolError):
    """This program was about to send a frame the state table forbids: a bug here, not a
    peer's mistake (the peer's mistakes are plain :class:`ProtocolError`)."""


_CLIENT_OPEN: tuple[FrameType, ...] = (
    wire.Connect, wire.Disconnect, wire.GetMembers, wire.Route, wire.Ping, wire.Pong,
    wire.Watch, wire.Unwatch, wire.Subscribe, wire.Unsubscribe, wire.Publish,
)
_ROUTER_OPEN: tuple[FrameType, ...] = (
    wire.Route, wire.Ok, wire.Error, wire.Ping, wire.Pong, wire.Event, wire.Publish,
)

# (role, state) -> {frame type that role may send in that state: the state after it}.
# A frame type missing from a cell is refused. ERROR before WELCOME is always a refusal
# followed by a close (unsupported_version, unauthorized, a bad first frame, limits), hence
# CLOSED; an ERROR once OPEN may answer one request and leave the connection open, so the
# table keeps it OPEN and the closing side calls close().
TRANSITIONS: dict[Role, dict[State, dict[FrameType, State]]] = {
    Role.CLIENT: {
        State.AWAIT_HELLO: {wire.Hello: State.AWAIT_WELCOME},
        # The client waits for WELCOME before anything else (docs/protocol.md §2).
        State.AWAIT_WELCOME: {},
        State.OPEN: dict.fromkeys(_CLIENT_OPEN, State.OPEN),
        State.CLOSED: {},
    },
    Role.ROUTER: {
        State.AWAIT_HELLO: {wire.Error: State.CLOSED},
        State.AWAIT_WELCOME: {wire.Welcome: State.OPEN, wire.Error: State.CLOSED},
        State.OPEN: dict.fromkeys(_ROUTER_OPEN, State.OPEN),
        State.CLOSED: {},
    },
}


def _frames(role: Role) -> frozenset[FrameType]:
    return frozenset(t for cell in TRANSITIONS[role].values() for t in cell)


# Every frame type a role may send in some state; anything else from it is refused outright.
CLIENT_FRAMES = _frames(Role.CLIENT)
ROUTER_FRAMES = _frames(Role.ROUTER)
_SENDS = {Role.CLIENT: CLIENT_FRAMES, Role.ROUTER: ROUTER_FRAMES}
# The handshake frames, and the states in which sending one again is a "second HELLO"
# (or WELCOME): the state the first one led to, and the ones after it.
_SECOND: dict[FrameType, tuple[State, ...]] = {
    wire.Hello: (State.AWAIT_WELCOME, State.OPEN),
    wire.Welcome: (State.OPEN,),
}
_WHEN = {State.AWAIT_HELLO: "before HELLO", State.AWAIT_WELCOME: "before WELCOME",
         State.OPEN: "once the connection is open", State.CLOSED: "after the connection closed"}


def refusal(role: Role, state: State, t: FrameType) -> str:
    """Why ``role`` may not send ``t`` in ``state``: the message the peer is told.

    The router's messages are those clients have always been given (docs/protocol.md §8):
    ``first frame must be HELLO, got X``, ``second HELLO``, ``a client may not send X``;
    the stub's handshake names a peer that answers HELLO with anything but WELCOME or ERROR
    as ``got X instead of WELCOME``.
    """
    name = t.__name__
    if role is Role.CLIENT and state is State.AWAIT_HELLO:
        return f"first frame must be HELLO, got {name}"
    if role is Role.ROUTER and state is State.AWAIT_WELCOME:
        return f"got {name} instead of WELCOME"
    if t not in _SENDS[role]:
        return f"a {role.value} may not send {name}"
    if state in _SECOND.get(t, ()):
        return f"second {name.upper()}"
    return f"a {role.value} may not send {name} {_WHEN[state]}"


class NativeState:
    """One native connection's state as one end sees it (``ours``: the role it plays).

    ``state`` is read by identity (``state is State.OPEN``); ``peer_moves`` is the table's
    cell for the peer in the current state, kept for a receive check of one dict lookup.
    """

    __slots__ = ("ours", "peer_moves", "state", "theirs")

    def __init__(self, ours: Role) -> None:
        self.ours = ours
        self.theirs = Role.ROUTER if ours is Role.CLIENT else Role.CLIENT
        self.state = State.AWAIT_HELLO
        self.peer_moves = TRANSITIONS[self.theirs][self.state]

    def __repr__(self) -> str:
        return f"<NativeState {self.ours.value} {self.state.value}>"

    def _enter(self, state: State) -> None:
        self.state = state
        self.peer_moves = TRANSITIONS[self.theirs][state]

    def receive(self, t: FrameType) -> State:
        """The peer sent a frame of type ``t``: move on, or raise :class:`ProtocolError`
        (the state is left as it was) if the table refuses it. Returns the new state."""
        nxt = self.peer_moves.get(t)
        if nxt is None:
            raise ProtocolError(refusal(self.theirs, self.state, t))
        if nxt is not self.state:
            self._enter(nxt)
        return nxt

    def send(self, t: FrameType) -> State:
        """This end is about to send a frame of type ``t``: move on, or raise
        :class:`LocalProtocolError` (nothing changes) if the table refuses it."""
        nxt = TRANSITIONS[self.ours][self.state].get(t)
        if nxt is None:
            raise LocalProtocolError(refusal(self.ours, self.state, t))
        if nxt is not self.state:
            self._enter(nxt)
        return nxt

    def close(self) -> None:
        """The connection is over (end of stream, or a closing ERROR): legal in any state."""
        if self.state is not State.CLOSED:
            self._enter(State.CLOSED)
