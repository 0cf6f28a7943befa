"""Command-line tools built on the RouterStub: ``members``, ``send`` and ``listen``.

They are click commands that ``gossiprouter.cli.main`` registers under the main
``gossiprouter`` group. Output is for people by default and one JSON value
(``members``) or one JSON object per line (``send``, ``listen``) with
``--json``. A mistake (an unreachable router, a bad argument, a refusal by
the router) ends in one line on stderr, ``gossiprouter: error: ...``, and
exit status 1 (2 for a bad argument); never a traceback.

HOST:PORT may list several routers separated by commas (IPv6 in brackets). An
ADDR is text (its UTF-8 bytes) or ``hex:`` followed by hex digits; addresses are
printed the same way (:mod:`gossiprouter.core.addresses`), so what ``members`` and
``listen`` print pastes straight into ``send --to``.

Every command leaves cleanly whatever the outcome (an error, Ctrl-C): it sends
DISCONNECT for what it joined before closing, so the group sees ``leave``, never
``suspect``.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeVar

import click
import trio

from gossiprouter.client.errors import NotConnectedError, RouterError, StubError
from gossiprouter.client.front import RouterStub
from gossiprouter.client.model import GroupEvent, Member, Message, Publication
from gossiprouter.client.status import ConnectionState, RouterAddress, StubEvent
from gossiprouter.core import addresses
from gossiprouter.core.addresses import format_addr, format_hostport
from gossiprouter.core.cli_errors import BadInput, CommandError
from gossiprouter.core.topics import (
    TopicError,
    TopicId,
    format_topic,
    parse_topic,
    pattern,
    topic_id,
)

__all__ = ["listen_command", "members_command", "publish_command", "send_command"]

R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])


# --------------------------------------------------------------------------- parsing


def parse_routers(value: str) -> list[RouterAddress]:
    try:
        return addresses.parse_hostports(value)
    except ValueError as e:
        raise BadInput(f"bad router address {value!r}: {e}") from None


def parse_addr(value: str, what: str = "ADDR") -> bytes:
    """``hex:0a0b...`` -> those bytes; anything else -> its UTF-8 bytes."""
    try:
        return addresses.parse_addr(value)
    except ValueError as e:
        raise BadInput(f"bad {what} {value!r}: {e}") from None


def check_group(group: str) -> str:
    try:
        return addresses.parse_group(group)
    except ValueError as e:
        raise BadInput(f"bad GROUP {group[:40]!r}: {e}") from None


# --------------------------------------------------------------------------- formatting


def _physical(m: Member) -> list[str]:
    return [format_hostport(h, p) for h, p in m.physical]


def member_json(m: Member) -> dict[str, Any]:
    return {"addr": format_addr(m.addr), "name": m.name, "physical": _physical(m)}


def _label(addr: bytes, names: dict[bytes, str]) -> str:
    name = names.get(addr)
    return f"{name} ({format_addr(addr)})" if name else format_addr(addr)


def _text(payload: bytes) -> str | None:
    try:
        return payload.decode()
    except UnicodeDecodeError:
        return None


def _now() -> str:
    return time.strftime("%H:%M:%S")


def _emit(obj: dict[str, Any]) -> None:
    click.echo(json.dumps(obj, ensure_ascii=False))
    sys.stdout.flush()


def _leaves(e: BaseException) -> Iterator[BaseException]:
    if isinstance(e, BaseExceptionGroup):
        for x in e.exceptions:
            yield from _leaves(x)
    else:
        yield e


def _run(fn: Callable[..., Awaitable[R]], *args: Any) -> R:
    """trio.run with every expected failure turned into one clear line."""
    # The stub logs reconnects and refusals; a command reports them itself.
    logging.getLogger("gossiprouter.stub").addHandler(logging.NullHandler())
    logging.getLogger("gossiprouter.stub").propagate = False
    try:
        return trio.run(fn, *args)
    except BaseException as exc:
        for e in _leaves(exc):
            if isinstance(e, click.ClickException):
                raise e from None
            if isinstance(e, NotConnectedError):
                raise CommandError(str(e)) from None
            if isinstance(e, RouterError):
                raise CommandError(f"the router refused: {e}") from None
            if isinstance(e, StubError):
                raise CommandError(str(e)) from None
            if isinstance(e, KeyboardInterrupt):
                sys.exit(130)
        raise


@asynccontextmanager
async def _session(routers: list[RouterAddress], timeout: float) -> AsyncIterator[RouterStub]:
    """A RouterStub that leaves cleanly however the command ends."""
    async with RouterStub(routers, connect_timeout=timeout, request_timeout=timeout,
                          send_timeout=timeout, reconnect_initial=0.5, reconnect_max=5.0,
                          heartbeat_interval=5.0, heartbeat_timeout=15.0) as stub:
        try:
            yield stub
        finally:
            # The stub sends DISCONNECT only when its block ends without an exception;
            # a command that fails (say send --to an unknown member) or is interrupted
            # would otherwise just close the connection, and the router would tell the
            # group "suspect". Shielded so that Ctrl-C cannot skip it; aclose is bounded.
            with trio.CancelScope(shield=True):
                await stub.aclose()


_ROUTER = click.argument("router", metavar="HOST:PORT")
_GROUP = click.argument("group")
_JSON = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
_TIMEOUT = click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0,
                        show_default=True,
                        help="Seconds to wait for the router (connect, answers).")


def _joins_as(flag: str, param: str, default_name: str) -> Callable[[F], F]:
    """The ADDR option (``flag``, passed as ``param``) and ``--name`` of a command that
    joins its group: one wording for send, publish and listen."""
    addr = click.option(flag, param, metavar="ADDR",
                        help="The address to join with; default: a new random 16-byte address.")
    name = click.option("--name", default=default_name, show_default=True,
                        help="Logical name to join with.")
    return lambda f: addr(name(f))


def _join_addr(value: str | None, flag: str) -> bytes:
    """The address given with ``flag``, or a new random 16-byte one."""
    return uuid.uuid4().bytes if value is None else parse_addr(value, f"{flag} ADDR")


async def _refusals(stub: RouterStub, group: str) -> dict[str, int]:
    """The asynchronous ERRORs the router sent for what was sent so far, by code.

    Requests are answered in order: once GET_MEMBERS is answered, an ERROR for an earlier
    frame (a unicast to an unknown member, a refused publication) has arrived before it.
    """
    await stub.members(group)
    return {k: v for k, v in stub.stats.async_errors.items() if v}


# --------------------------------------------------------------------------- members


@click.command("members")
@_ROUTER
@_GROUP
@_JSON
@_TIMEOUT
def members_command(router: str, group: str, as_json: bool, timeout: float) -> None:
    """List the members of GROUP (without joining it).

    Works for the JGroups namespaces too (groups named jgroups2:... and
    jgroups5:...). With several routers (HOST:PORT,HOST:PORT) it lists the
    union of what the reachable routers know.

    \b
    Examples:
      gossiprouter members 127.0.0.1:12001 demo
      gossiprouter members 127.0.0.1:12001 jgroups5:mycluster --json
    """
    routers = parse_routers(router)
    check_group(group)

    async def run() -> list[Member]:
        async with _session(routers, timeout) as stub:
            await stub.wait_connected(timeout, fail_fast=True, all_routers=True)
            return await stub.members(group)

    members = _run(run)
    if as_json:
        click.echo(json.dumps([member_json(m) for m in members]))
        return
    if not members:
        click.echo(f"no members in {group!r}", err=True)
        return
    width = max(len(format_addr(m.addr)) for m in members)
    for m in members:
        phys = ", ".join(_physical(m)) or "-"
        click.echo(f"{format_addr(m.addr):<{width}}  {m.name or '-'}  {phys}")


# --------------------------------------------------------------------------- send


@click.command("send")
@_ROUTER
@_GROUP
@click.argument("text")
@click.option("--to", "to", metavar="ADDR",
              help="Send to this member only (text, or hex:0a0b...); default: the whole group.")
@_joins_as("--from", "sender", "gossiprouter-send")
@_JSON
@_TIMEOUT
def send_command(router: str, group: str, text: str, to: str | None, sender: str | None,
                 name: str, as_json: bool, timeout: float) -> None:
    """Join GROUP, send TEXT (UTF-8) to the group or to one member, and leave.

    \b
    Examples:
      gossiprouter send 127.0.0.1:12001 demo "hello everyone"
      gossiprouter send 127.0.0.1:12001 demo --to hex:0102 "hello you"
    """
    routers = parse_routers(router)
    check_group(group)
    dest = None if to is None else parse_addr(to, "--to ADDR")
    addr = _join_addr(sender, "--from")
    payload = text.encode()

    async def run() -> None:
        async with _session(routers, timeout) as stub:
            await stub.wait_connected(timeout, fail_fast=True)
            ch = await stub.connect(group, addr, name=name)
            await ch.send(payload, dest)
            if dest is not None and "unknown_destination" in await _refusals(stub, group):
                raise CommandError(f"no member {format_addr(dest)} in {group!r}: "
                                   "message dropped")

    _run(run)
    shown_dest = None if dest is None else format_addr(dest)
    if as_json:
        _emit({"group": group, "sender": format_addr(addr), "dest": shown_dest,
               "bytes": len(payload)})
    else:
        target = f"member {shown_dest} of {group!r}" if dest is not None else f"group {group!r}"
        click.echo(f"sent {len(payload)} bytes to {target} as {format_addr(addr)}")


# --------------------------------------------------------------------------- listen


@click.command("listen")
@_ROUTER
@_GROUP
@click.option("--watch-only", is_flag=True,
              help="Only watch joins and leaves; do not join the group (no messages). "
                   "The only way for the JGroups namespaces.")
@_joins_as("--addr", "addr_text", "gossiprouter-listen")
@click.option("--subscribe", "patterns", metavar="PATTERN", multiple=True,
              help="Also receive topic publications matching PROVIDER/BROADCAST[/PARTITION...] "
                   "('+' one level, '*' last: any levels); repeatable.")
@_JSON
@_TIMEOUT
def listen_command(router: str, group: str, watch_only: bool, addr_text: str | None,
                   name: str, as_json: bool, timeout: float,
                   patterns: tuple[str, ...] = ()) -> None:
    """Print GROUP's messages and membership events until Ctrl-C.

    Watches the group (join / leave) and, unless --watch-only, joins it as a
    member to receive its messages (and suspect events). Survives router
    restarts: the connection is re-established and the group re-joined.
    A router that does not answer at start is an error (exit status 1, with the
    cause), so a mistyped address fails at once rather than waiting forever.
    With --json, one JSON object per line: first {"type": "members", ...},
    then "message", "event" and "state" objects.

    \b
    Examples:
      gossiprouter listen 127.0.0.1:12001 demo
      gossiprouter listen 127.0.0.1:12001 jgroups5:mycluster --watch-only --json
    """
    routers = parse_routers(router)
    check_group(group)
    addr = _join_addr(addr_text, "--addr")
    names: dict[bytes, str] = {}
    subs = [_pattern_arg(p) for p in patterns]
    if subs and watch_only:
        raise BadInput("--subscribe needs a member: it cannot go with --watch-only")

    def show_message(m: Message) -> None:
        text = _text(m.payload)
        if isinstance(m, Publication):
            show_publication(m, text)
            return
        if as_json:
            _emit({"type": "message", "group": m.group, "sender": format_addr(m.sender),
                   "dest": None if m.dest is None else format_addr(m.dest), "text": text,
                   "payload_hex": m.payload.hex()})
            return
        to = "group" if m.dest is None else "me"
        body = text if text is not None else "hex:" + m.payload.hex()
        click.echo(f"{_now()} message from {_label(m.sender, names)} to {to}: {body}")

    def show_publication(m: Publication, text: str | None) -> None:
        if as_json:
            _emit({"type": "publication", "group": m.group, "sender": format_addr(m.sender),
                   "topic": [m.topic[0], m.topic[1], list(m.topic[2])], "scope": m.scope,
                   "text": text, "payload_hex": m.payload.hex()})
            return
        body = text if text is not None else "hex:" + m.payload.hex()
        click.echo(f"{_now()} {m.scope} publication {format_topic(m.topic)} from "
                   f"{_label(m.sender, names)}: {body}")

    def show_event(e: GroupEvent) -> None:
        m = e.member
        if e.kind == "join" and m.name:
            names[m.addr] = m.name
        if as_json:
            obj = {"type": "event", "kind": e.kind, "group": e.group, **member_json(m),
                   "router": format_hostport(*e.router)}
            if e.error is not None:
                obj["error"] = str(e.error)
            _emit(obj)
            return
        phys = " ".join(_physical(m))
        extra = f": {e.error}" if e.error is not None else ""
        click.echo(f"{_now()} {e.kind:<7} {_label(m.addr, names)} {phys}".rstrip() + extra)

    def show_state(ev: StubEvent) -> None:
        where = format_hostport(*ev.router)
        if ev.state is ConnectionState.CONNECTING:
            return
        if as_json:
            _emit({"type": "state", "router": where, "state": ev.state.value,
                   "error": ev.error, "delay": ev.delay})
        elif ev.state is ConnectionState.RECONNECTING:
            click.echo(f"{_now()} router {where} down ({ev.error}); retrying in "
                       f"{ev.delay or 0:.1f}s", err=True)
        elif ev.state is ConnectionState.CONNECTED:
            click.echo(f"{_now()} router {where} connected", err=True)

    async def run() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with _session(routers, timeout) as stub:
                await stub.wait_connected(timeout, fail_fast=True, all_routers=True)
                states = stub.state_changes()
                watch = await stub.watch(group)
                chan = None
                if not watch_only:
                    try:
                        chan = await stub.connect(group, addr, name=name)
                    except RouterError as e:
                        hint = " (use --watch-only)" if e.code == "forbidden" else ""
                        raise CommandError(f"cannot join {group!r}: {e}{hint}") from None
                    for pat in subs:
                        await chan.subscribe(*pat)
                members = await stub.members(group)
                for m in members:
                    if m.name:
                        names[m.addr] = m.name
                if as_json:
                    _emit({"type": "members", "group": group,
                           "members": [member_json(m) for m in members]})
                else:
                    listed = ", ".join(_label(m.addr, names) for m in members) or "none"
                    click.echo(f"{_now()} members of {group!r}: {listed}")
                who = "watching" if chan is None else f"listening as {format_addr(addr)}"
                click.echo(f"{who} in {group!r}; Ctrl-C to stop", err=True)
                async with trio.open_nursery() as n:

                    async def stop_on_signal() -> None:
                        async for _ in signals:
                            n.cancel_scope.cancel()
                            return

                    async def show_items() -> None:
                        if chan is None:
                            async for e in watch:
                                show_event(e)
                            return
                        # One stream, so messages and events print in the order they
                        # arrived; the channel also gets the watched group's join/leave
                        # (but not its own).
                        async for item in chan.incoming():
                            if isinstance(item, Message):
                                show_message(item)
                            else:
                                show_event(item)

                    async def state_events() -> None:
                        async for ev in states:
                            show_state(ev)

                    for task in (stop_on_signal, show_items, state_events):
                        n.start_soon(task)

    _run(run)


# --------------------------------------------------------------------------- publish


def _topic_arg(value: str, what: str, concrete: bool) -> TopicId:
    try:
        p, b, part = parse_topic(value)
        return topic_id(p, b, part) if concrete else pattern(p, b, part)
    except TopicError as e:
        raise BadInput(f"{what} {value!r}: {e}") from None


def _pattern_arg(value: str) -> TopicId:
    return _topic_arg(value, "--subscribe PATTERN", concrete=False)


@click.command("publish")
@_ROUTER
@_GROUP
@click.argument("topic", metavar="ID")
@click.argument("text", metavar="PAYLOAD")
@click.option("--global", "is_global", is_flag=True,
              help="Scope global: also to the subscribers of every router federated with this "
                   "one (see serve --bridge); default: this router's subscribers only.")
@_joins_as("--from", "sender", "gossiprouter-publish")
@_JSON
@_TIMEOUT
def publish_command(router: str, group: str, topic: str, text: str, is_global: bool,
                    sender: str | None, name: str, as_json: bool, timeout: float) -> None:
    """Join GROUP, publish PAYLOAD (UTF-8) to the multicast ID, and leave.

    ID is PROVIDER/BROADCAST[/PARTITION...], e.g. vehicle-17/position/eu/de/munich
    (a concrete id: no '+' or '*' levels).

    \b
    Examples:
      gossiprouter publish 127.0.0.1:12001 demo vehicle-17/position/eu/de 48.1,11.6
      gossiprouter publish 127.0.0.1:12001 demo vehicle-17/position/eu 48.1 --global
    """
    routers = parse_routers(router)
    check_group(group)
    tid = _topic_arg(topic, "ID", concrete=True)
    addr = _join_addr(sender, "--from")
    payload = text.encode()
    scope: Literal["local", "global"] = "global" if is_global else "local"

    async def run() -> None:
        async with _session(routers, timeout) as stub:
            await stub.wait_connected(timeout, fail_fast=True)
            ch = await stub.connect(group, addr, name=name)
            await ch.publish(tid, payload, scope=scope)
            errors = await _refusals(stub, group)  # bad_topic, not_member
            if errors:
                raise CommandError(f"the router refused the publication: {', '.join(errors)}")
            await ch.disconnect()

    _run(run)
    if as_json:
        _emit({"group": group, "sender": format_addr(addr), "topic": [tid[0], tid[1], list(tid[2])],
               "scope": scope, "bytes": len(payload)})
    else:
        click.echo(f"published {len(payload)} bytes to {format_topic(tid)} ({scope}) in "
                   f"{group!r} as {format_addr(addr)}")
