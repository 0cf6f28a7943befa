"""Command-line tools built on the RouterStub: ``members``, ``send`` and ``listen``.

They are click commands that ``gossiprouter.cli`` registers under the main
``gossiprouter`` group. Output is for people by default and one JSON value
(``members``) or one JSON object per line (``send``, ``listen``) with
``--json``. A mistake (an unreachable router, a bad argument, a refusal by
the router) ends in one line on stderr, ``gossiprouter: error: ...``, and
exit status 1 (2 for a bad argument); never a traceback.

HOST:PORT may list several routers separated by commas. An ADDR is text
(its UTF-8 bytes) or ``hex:`` followed by hex digits.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Literal, TypeVar

import click
import trio

from gossiprouter.stub import (
    ConnectionState,
    GroupEvent,
    Member,
    Message,
    NotConnectedError,
    Publication,
    RouterAddress,
    RouterError,
    RouterStub,
    StubError,
    StubEvent,
    parse_router,
)
from gossiprouter.topics import TopicError, TopicId, format_topic, parse_topic, pattern, topic_id

__all__ = ["listen_command", "members_command", "publish_command", "send_command"]

R = TypeVar("R")


class ToolError(click.ClickException):
    """One line on stderr and exit status 1, like the ``serve`` command's errors."""

    def show(self, file: Any = None) -> None:
        click.echo(f"gossiprouter: error: {self.message}", err=True)


class BadArgument(ToolError):
    exit_code = 2


# --------------------------------------------------------------------------- parsing


def parse_routers(value: str) -> list[RouterAddress]:
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts:
        raise BadArgument(f"bad router address {value!r}: expected HOST:PORT")
    try:
        return [parse_router(p) for p in parts]
    except ValueError:
        raise BadArgument(f"bad router address {value!r}: expected HOST:PORT with a port "
                          "from 1 to 65535 (several separated by commas)") from None


def parse_addr(value: str, what: str = "ADDR") -> bytes:
    """``hex:0a0b...`` -> those bytes; anything else -> its UTF-8 bytes."""
    if value.startswith("hex:"):
        try:
            b = bytes.fromhex(value[4:])
        except ValueError:
            raise BadArgument(f"bad {what} {value!r}: expected hex digits after 'hex:'") from None
    else:
        b = value.encode()
    if not b:
        raise BadArgument(f"bad {what} {value!r}: an address must not be empty")
    if len(b) > 255:
        raise BadArgument(f"bad {what} {value!r}: an address is at most 255 bytes")
    return b


def check_group(group: str) -> str:
    if not group:
        raise BadArgument("bad GROUP '': a group name must not be empty")
    if len(group.encode()) > 1024:
        raise BadArgument("bad GROUP: a group name is at most 1024 bytes of UTF-8")
    return group


# --------------------------------------------------------------------------- formatting


def member_json(m: Member) -> dict[str, Any]:
    return {"addr": m.addr.hex(), "name": m.name, "physical": [f"{h}:{p}" for h, p in m.physical]}


def _label(addr: bytes, names: dict[bytes, str]) -> str:
    name = names.get(addr)
    return f"{name} ({addr.hex()})" if name else addr.hex()


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
                raise ToolError(str(e)) from None
            if isinstance(e, RouterError):
                raise ToolError(f"the router refused: {e}") from None
            if isinstance(e, StubError):
                raise ToolError(str(e)) from None
            if isinstance(e, KeyboardInterrupt):
                sys.exit(130)
        raise


def _stub(routers: list[RouterAddress], timeout: float) -> RouterStub:
    return RouterStub(routers, connect_timeout=timeout, request_timeout=timeout,
                      send_timeout=timeout, reconnect_initial=0.5, reconnect_max=5.0,
                      heartbeat_interval=5.0, heartbeat_timeout=15.0)


_ROUTER = click.argument("router", metavar="HOST:PORT")
_GROUP = click.argument("group")
_JSON = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
_TIMEOUT = click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0,
                        show_default=True,
                        help="Seconds to wait for the router (connect, answers).")


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
        async with _stub(routers, timeout) as stub:
            await stub.wait_connected(timeout, fail_fast=True, all_routers=True)
            return await stub.members(group)

    members = _run(run)
    if as_json:
        click.echo(json.dumps([member_json(m) for m in members]))
        return
    if not members:
        click.echo(f"no members in {group!r}", err=True)
        return
    width = max(len(m.addr.hex()) for m in members)
    for m in members:
        phys = ", ".join(f"{h}:{p}" for h, p in m.physical) or "-"
        click.echo(f"{m.addr.hex():<{width}}  {m.name or '-'}  {phys}")


# --------------------------------------------------------------------------- send


@click.command("send")
@_ROUTER
@_GROUP
@click.argument("text")
@click.option("--to", "to", metavar="ADDR",
              help="Send to this member only (text, or hex:0a0b...); default: the whole group.")
@click.option("--from", "sender", metavar="ADDR",
              help="The address to join with; default: a new random 16-byte address.")
@click.option("--name", default="gossiprouter-send", show_default=True,
              help="Logical name to join with.")
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
    addr = uuid.uuid4().bytes if sender is None else parse_addr(sender, "--from ADDR")
    payload = text.encode()

    async def run() -> None:
        async with _stub(routers, timeout) as stub:
            await stub.wait_connected(timeout, fail_fast=True)
            ch = await stub.connect(group, addr, name=name)
            await ch.send(payload, dest)
            if dest is not None:
                # The router answers requests in order: once GET_MEMBERS is answered, an
                # ERROR unknown_destination for the unicast would have arrived before it.
                await stub.members(group)
                if stub.stats.async_errors.get("unknown_destination"):
                    raise ToolError(f"no member {dest.hex()} in {group!r}: message dropped")
            await ch.disconnect()

    _run(run)
    if as_json:
        _emit({"group": group, "sender": addr.hex(), "dest": None if dest is None else dest.hex(),
               "bytes": len(payload)})
    else:
        target = f"member {dest.hex()} of {group!r}" if dest is not None else f"group {group!r}"
        click.echo(f"sent {len(payload)} bytes to {target} as {addr.hex()}")


# --------------------------------------------------------------------------- listen


@click.command("listen")
@_ROUTER
@_GROUP
@click.option("--watch-only", is_flag=True,
              help="Only watch joins and leaves; do not join the group (no messages). "
                   "The only way for the JGroups namespaces.")
@click.option("--addr", "addr_text", metavar="ADDR",
              help="The address to join with; default: a new random 16-byte address.")
@click.option("--name", default="gossiprouter-listen", show_default=True,
              help="Logical name to join with.")
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
    With --json, one JSON object per line: first {"type": "members", ...},
    then "message", "event" and "state" objects.

    \b
    Examples:
      gossiprouter listen 127.0.0.1:12001 demo
      gossiprouter listen 127.0.0.1:12001 jgroups5:mycluster --watch-only --json
    """
    routers = parse_routers(router)
    check_group(group)
    addr = uuid.uuid4().bytes if addr_text is None else parse_addr(addr_text, "--addr ADDR")
    names: dict[bytes, str] = {}
    subs = [_pattern_arg(p) for p in patterns]
    if subs and watch_only:
        raise BadArgument("--subscribe needs a member: it cannot go with --watch-only")

    def show_message(m: Message) -> None:
        text = _text(m.payload)
        if isinstance(m, Publication):
            show_publication(m, text)
            return
        if as_json:
            _emit({"type": "message", "group": m.group, "sender": m.sender.hex(),
                   "dest": None if m.dest is None else m.dest.hex(), "text": text,
                   "payload_hex": m.payload.hex()})
            return
        to = "group" if m.dest is None else "me"
        body = text if text is not None else "hex:" + m.payload.hex()
        click.echo(f"{_now()} message from {_label(m.sender, names)} to {to}: {body}")

    def show_publication(m: Publication, text: str | None) -> None:
        if as_json:
            _emit({"type": "publication", "group": m.group, "sender": m.sender.hex(),
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
                   "router": f"{e.router[0]}:{e.router[1]}"}
            if e.error is not None:
                obj["error"] = str(e.error)
            _emit(obj)
            return
        phys = " ".join(f"{h}:{p}" for h, p in m.physical)
        extra = f": {e.error}" if e.error is not None else ""
        click.echo(f"{_now()} {e.kind:<7} {_label(m.addr, names)} {phys}".rstrip() + extra)

    def show_state(ev: StubEvent) -> None:
        where = f"{ev.router[0]}:{ev.router[1]}"
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
            async with _stub(routers, timeout) as stub:
                await stub.wait_connected(timeout, fail_fast=True, all_routers=True)
                states = stub.state_changes()
                watch = await stub.watch(group)
                chan = None
                if not watch_only:
                    try:
                        chan = await stub.connect(group, addr, name=name)
                    except RouterError as e:
                        hint = " (use --watch-only)" if e.code == "forbidden" else ""
                        raise ToolError(f"cannot join {group!r}: {e}{hint}") from None
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
                who = "watching" if chan is None else f"listening as {addr.hex()}"
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
                # Leaving the RouterStub block disconnects cleanly: peers see "leave".

    _run(run)


# --------------------------------------------------------------------------- publish


def _topic_arg(value: str, what: str, concrete: bool) -> TopicId:
    try:
        p, b, part = parse_topic(value)
        return topic_id(p, b, part) if concrete else pattern(p, b, part)
    except TopicError as e:
        raise BadArgument(f"{what} {value!r}: {e}") from None


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
@click.option("--from", "sender", metavar="ADDR",
              help="The address to join with; default: a new random 16-byte address.")
@click.option("--name", default="gossiprouter-publish", show_default=True,
              help="Logical name to join with.")
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
    addr = uuid.uuid4().bytes if sender is None else parse_addr(sender, "--from ADDR")
    payload = text.encode()
    scope: Literal["local", "global"] = "global" if is_global else "local"

    async def run() -> None:
        async with _stub(routers, timeout) as stub:
            await stub.wait_connected(timeout, fail_fast=True)
            ch = await stub.connect(group, addr, name=name)
            await ch.publish(tid, payload, scope=scope)
            # Requests are answered in order: once GET_MEMBERS is answered, an ERROR
            # for the publication (bad_topic, not_member) would have arrived before it.
            await stub.members(group)
            errors = {k: v for k, v in stub.stats.async_errors.items() if v}
            if errors:
                raise ToolError(f"the router refused the publication: {', '.join(errors)}")
            await ch.disconnect()

    _run(run)
    if as_json:
        _emit({"group": group, "sender": addr.hex(), "topic": [tid[0], tid[1], list(tid[2])],
               "scope": scope, "bytes": len(payload)})
    else:
        click.echo(f"published {len(payload)} bytes to {format_topic(tid)} ({scope}) in "
                   f"{group!r} as {addr.hex()}")
