"""The native protocol's state table (protocol/native_state.py), without sockets.

:data:`SPEC` below is the protocol written out by hand from docs/protocol.md §2, §3 and §8,
independently of the module's table: every (role, state, frame type) cell is checked against
it in both directions (the sender's ``send`` and the receiver's ``receive``), legal and
illegal. Then the router session's use of it: the hot loop's ``ready`` flag in step with the
state, and the guard on what the session is about to send.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from gossiprouter.core.config import Config
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.native_state import (
    CLIENT_FRAMES,
    ROUTER_FRAMES,
    TRANSITIONS,
    LocalProtocolError,
    NativeState,
    Role,
    State,
)
from gossiprouter.sessions.base import Hub
from gossiprouter.sessions.native import NativeSession

ROOT = Path(__file__).resolve().parent.parent
FRAMES: tuple[type[wire.Frame], ...] = typing.get_args(wire.Frame)
CLIENT, ROUTER = Role.CLIENT, Role.ROUTER
AWAIT_HELLO, AWAIT_WELCOME, OPEN, CLOSED = (State.AWAIT_HELLO, State.AWAIT_WELCOME, State.OPEN,
                                            State.CLOSED)


def wire_name(t: type[wire.Frame]) -> str:
    """GetMembers -> GET_MEMBERS: the frame type's name in docs/protocol.md."""
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", t.__name__).upper()


# (role, state) -> {wire name: next state}: what docs/protocol.md says, typed in by hand.
_CLIENT_REQUESTS = ("CONNECT", "DISCONNECT", "GET_MEMBERS", "ROUTE", "PING", "PONG", "WATCH",
                    "UNWATCH", "SUBSCRIBE", "UNSUBSCRIBE", "PUBLISH")
_ROUTER_OPEN = ("ROUTE", "OK", "ERROR", "PING", "PONG", "EVENT", "PUBLISH")
SPEC: dict[tuple[Role, State], dict[str, State]] = {
    (CLIENT, AWAIT_HELLO): {"HELLO": AWAIT_WELCOME},
    (CLIENT, AWAIT_WELCOME): {},
    (CLIENT, OPEN): dict.fromkeys(_CLIENT_REQUESTS, OPEN),
    (CLIENT, CLOSED): {},
    (ROUTER, AWAIT_HELLO): {"ERROR": CLOSED},
    (ROUTER, AWAIT_WELCOME): {"WELCOME": OPEN, "ERROR": CLOSED},
    (ROUTER, OPEN): dict.fromkeys(_ROUTER_OPEN, OPEN),
    (ROUTER, CLOSED): {},
}


def other(role: Role) -> Role:
    return ROUTER if role is CLIENT else CLIENT


def at(ours: Role, state: State) -> NativeState:
    """A machine of role ``ours`` brought to ``state`` the legal way (HELLO, WELCOME, close)."""
    m = NativeState(ours)
    steps = {AWAIT_HELLO: 0, AWAIT_WELCOME: 1, OPEN: 2, CLOSED: 3}[state]
    for i, (role, t) in enumerate(((CLIENT, wire.Hello), (ROUTER, wire.Welcome))):
        if i < steps:
            (m.send if role is ours else m.receive)(t)
    if state is CLOSED:
        m.close()
    assert m.state is state
    return m


CELLS = [(role, state, t) for role in Role for state in State for t in FRAMES]


def test_the_frame_types_are_the_wire_types() -> None:
    assert sorted(wire_name(t) for t in FRAMES) == sorted(t.name for t in wire.FrameType)


@pytest.mark.parametrize(("role", "state", "t"), CELLS,
                         ids=[f"{r.value}-{s.value}-{t.__name__}" for r, s, t in CELLS])
def test_every_cell_in_both_directions(role: Role, state: State, t: type[wire.Frame]) -> None:
    expected = SPEC[(role, state)].get(wire_name(t))
    # The sender's side: ``send`` moves on, or refuses as our own bug.
    sender = at(role, state)
    # The receiver's side: ``receive`` moves on, or refuses as the peer's mistake.
    receiver = at(other(role), state)
    if expected is None:
        with pytest.raises(LocalProtocolError):
            sender.send(t)
        with pytest.raises(ProtocolError) as err:
            receiver.receive(t)
        assert not isinstance(err.value, LocalProtocolError)
        assert err.value.code == "protocol"
        # A refused frame changes nothing.
        assert sender.state is state and receiver.state is state
    else:
        assert sender.send(t) is expected and sender.state is expected
        assert receiver.receive(t) is expected and receiver.state is expected


def test_close_is_legal_everywhere_and_final() -> None:
    for role in Role:
        for state in State:
            m = at(role, state)
            m.close()
            m.close()
            assert m.state is CLOSED
            for t in FRAMES:
                with pytest.raises(LocalProtocolError):
                    m.send(t)
                with pytest.raises(ProtocolError):
                    m.receive(t)


def test_which_frames_each_role_may_ever_send() -> None:
    # "A client may not send X" is derived from the table, not listed apart.
    assert {wire_name(t) for t in CLIENT_FRAMES} == {"HELLO", *_CLIENT_REQUESTS}
    assert {wire_name(t) for t in ROUTER_FRAMES} == {"WELCOME", *_ROUTER_OPEN}
    # Every frame type is someone's: both lists cover the protocol.
    assert set(FRAMES) == CLIENT_FRAMES | ROUTER_FRAMES


@pytest.mark.parametrize(("role", "state", "t", "message"), [
    # The router's answers, as clients have always been told (docs/protocol.md §8).
    (CLIENT, AWAIT_HELLO, wire.GetMembers, "first frame must be HELLO, got GetMembers"),
    (CLIENT, AWAIT_HELLO, wire.Route, "first frame must be HELLO, got Route"),
    (CLIENT, AWAIT_HELLO, wire.Ok, "first frame must be HELLO, got Ok"),
    (CLIENT, OPEN, wire.Hello, "second HELLO"),
    (CLIENT, OPEN, wire.Ok, "a client may not send Ok"),
    (CLIENT, OPEN, wire.Welcome, "a client may not send Welcome"),
    (CLIENT, OPEN, wire.Event, "a client may not send Event"),
    (CLIENT, AWAIT_WELCOME, wire.Connect, "a client may not send Connect before WELCOME"),
    (CLIENT, AWAIT_WELCOME, wire.Hello, "second HELLO"),
    (CLIENT, CLOSED, wire.Ping, "a client may not send Ping after the connection closed"),
    # The stub's view of the router.
    (ROUTER, AWAIT_WELCOME, wire.Event, "got Event instead of WELCOME"),
    (ROUTER, OPEN, wire.Welcome, "second WELCOME"),
    (ROUTER, OPEN, wire.Connect, "a router may not send Connect"),
    (ROUTER, AWAIT_HELLO, wire.Ok, "a router may not send Ok before HELLO"),
    (ROUTER, AWAIT_HELLO, wire.Welcome, "a router may not send Welcome before HELLO"),
])
def test_refusals_name_the_cause(role: Role, state: State, t: type[wire.Frame],
                                 message: str) -> None:
    with pytest.raises(ProtocolError, match=f"^{re.escape(message)}$"):
        at(other(role), state).receive(t)
    with pytest.raises(LocalProtocolError, match=f"^{re.escape(message)}$"):
        at(role, state).send(t)


def _docs_table() -> str:
    """The table of docs/protocol.md §12, rendered from TRANSITIONS."""
    order = sorted(FRAMES, key=lambda t: wire.FrameType[wire_name(t)])

    def cell(role: Role, state: State) -> str:
        moves = TRANSITIONS[role][state]
        if not moves:
            return "nothing"
        stay = [wire_name(t) for t in order if moves.get(t) is state]
        go = [f"{wire_name(t)} → {moves[t].value}" for t in order
              if t in moves and moves[t] is not state]
        return ", ".join(stay + go)

    lines = ["| state | the client may send | the router may send |", "|---|---|---|"]
    lines += [f"| {s.value} | {cell(CLIENT, s)} | {cell(ROUTER, s)} |" for s in State]
    return "\n".join(lines) + "\n"


def test_docs_show_the_table() -> None:
    text = (ROOT / "docs" / "protocol.md").read_text()
    assert _docs_table() in text, (
        "docs/protocol.md §12 must hold the state table as the code has it:\n" + _docs_table())


# --------------------------------------------------------------------------- the router session


def _session() -> NativeSession:
    return NativeSession(Hub(Config(port=0)), "peer")


def _sent(s: NativeSession) -> list[wire.Frame]:
    dec = wire.Decoder()
    dec.feed(b"".join(s.outbox.take()))
    return dec.frames()


def test_ready_follows_the_state() -> None:
    s = _session()
    assert s.ready is False and s.proto.state is AWAIT_HELLO
    s.on_data(wire.encode(wire.Hello((1,), "t")), 0.0)
    assert s.ready is True and s.proto.state is OPEN
    assert [type(f) for f in _sent(s)] == [wire.Welcome]
    s.close("shutting_down", "bye")
    assert s.ready is False and s.proto.state is CLOSED
    # A plain attribute, so the hot loop's per-frame test is one attribute read.
    assert type(vars(s)["ready"]) is bool


def test_a_refused_hello_leaves_the_session_closed_and_not_ready() -> None:
    s = _session()
    s.on_data(wire.encode(wire.Hello((7,), "future")), 0.0)
    assert s.ready is False and s.proto.state is CLOSED
    assert s.outbox.closed
    [err] = _sent(s)
    assert isinstance(err, wire.Error) and err.code == "unsupported_version"


def test_route_before_hello_is_refused_by_the_table() -> None:
    # The ROUTE fast path is gated by ``ready``; before WELCOME the frame reaches the table.
    s = _session()
    s.on_data(wire.encode_route("g", None, b"A", b"x"), 0.0)
    assert s.outbox.closed and s.ready is False
    assert _sent(s) == [wire.Error(None, "protocol", "first frame must be HELLO, got Route")]


def test_the_session_refuses_to_send_out_of_turn() -> None:
    s = _session()
    # An OK before WELCOME would be the router's bug: refused before anything is queued.
    with pytest.raises(LocalProtocolError, match=r"^a router may not send Ok before HELLO$"):
        s._reply(wire.Ok(1))
    assert s.outbox.take() == []
    s.on_data(wire.encode(wire.Hello((1,), "t")), 0.0)
    s.outbox.take()
    with pytest.raises(LocalProtocolError, match=r"^second WELCOME$"):
        s._reply(wire.Welcome(1, "r", {}))
    with pytest.raises(LocalProtocolError, match=r"^a router may not send Connect$"):
        s._reply(wire.Connect(1, "g", b"A"))
    assert s.outbox.take() == []
    s._reply(wire.Ok(2))  # legal once open
    assert _sent(s) == [wire.Ok(2)]
