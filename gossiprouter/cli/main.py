"""The ``gossiprouter`` command line (click): parses options, builds a Config, calls in.

Every user mistake (a bad option, a taken port, an unreachable router) ends in
one clear line on stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import click
import trio

from gossiprouter import __version__
from gossiprouter.analytics.cli import analyze_command
from gossiprouter.client.cli import listen_command, members_command, publish_command, send_command
from gossiprouter.core.addresses import format_hostport
from gossiprouter.core.cli_errors import PREFIX, BadInput, CommandError, needs_extra
from gossiprouter.core.config import OPTIONS, ConfigError, build, check
from gossiprouter.core.options import SECTIONS, Option
from gossiprouter.loadtest.cli import loadtest_command
from gossiprouter.loadtest.topics import loadtest_topics_command
from gossiprouter.ops.dump import dump
from gossiprouter.ops.logs import use_format as use_log_format
from gossiprouter.ops.runtime import Operations, check_startup, reload_on_sighup
from gossiprouter.server import fastpath
from gossiprouter.server.listener import ListenError, Server

log = logging.getLogger("gossiprouter")


def _click_type(o: Option) -> Any:
    if o.choices:
        return click.Choice(o.choices, case_sensitive=False)
    return {int: int, float: float, str: str, bool: bool}[o.type]


def _help(o: Option) -> str:
    unit = f" ({o.unit})" if o.unit else ""
    shown = o.default if o.default != "" else "none"
    if o.type is tuple:
        shown = ", ".join(o.default) or "none"
        unit = f" Repeat or comma-separate for several.{unit}"
    return f"{o.help}{unit}  [default: {shown}]"


def _checked(o: Option, value: Any) -> Any:
    """A value given on the command line, checked like the config file's: a bad one is a
    usage error (exit status 2, as for any other bad option), not a failure to start."""
    if value is None:
        return None
    try:
        check(o, value)
    except ConfigError as e:
        # "port = 70000: expected ..." names the config key; the user typed --port, which
        # click names, so keep "70000: expected ...".
        raise click.BadParameter(re.sub(rf"^{o.name}(\[\d+\])? = ", "", str(e))) from None
    return value


def _value(o: Option) -> Any:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        return _checked(o, value)

    return callback


def _list_value(o: Option) -> Any:
    def callback(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> Any:
        # Not given -> None, so the config file's value stands (click gives () by default).
        items = tuple(s.strip() for v in value for s in v.split(",") if s.strip())
        return _checked(o, items or None)

    return callback


def router_options(f: Any) -> Any:
    """Add one click option per router option in :data:`gossiprouter.core.config.OPTIONS`."""
    for o in reversed(OPTIONS):
        if o.type is bool:
            name = o.name.replace("_", "-")
            decl = f"--{name}/--no-{name}"
            f = click.option(decl, o.name, default=None, help=_help(o))(f)
        elif o.type is tuple:  # a list option: repeatable
            f = click.option(o.flag, o.name, multiple=True, callback=_list_value(o),
                             metavar=_metavar(o), help=_help(o))(f)
        else:
            f = click.option(o.flag, o.name, type=_click_type(o), default=None, metavar=_metavar(o),
                             callback=_value(o), help=_help(o))(f)
    return f


def _metavar(o: Option) -> str:
    if o.metavar:
        return o.metavar
    if o.choices:
        return "[" + "|".join(o.choices) + "]"
    return {int: "INT", float: "SECONDS" if o.unit == "seconds" else "NUM", str: "TEXT"}[o.type]


class _SectionedCommand(click.Command):
    """``serve``: its options under headings (:data:`gossiprouter.core.options.SECTIONS`),
    each with its one-line text as click writes it; ``--config`` and ``--help`` first."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        section = {o.name: o.section for o in OPTIONS}
        rows: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                rows.setdefault(section.get(param.name or "", "Options"), []).append(record)
        for title in ("Options", *SECTIONS):
            if title in rows:
                with formatter.section(title):
                    formatter.write_dl(rows[title])


class _UsageError(click.UsageError):
    """Click's usage errors in the one format: ``gossiprouter: error: ...``, exit 2."""

    def show(self, file: Any = None) -> None:
        msg = self.message.rstrip(".")
        if msg[:1].isupper() and msg[1:2].islower():  # "No such option" -> "no such option"
            msg = msg[0].lower() + msg[1:]
        where = f" (see '{self.ctx.command_path} --help')" if self.ctx is not None else ""
        click.echo(f"{PREFIX}{msg}{where}", err=True)


def _restyled(e: click.UsageError) -> click.UsageError:
    if isinstance(e, _UsageError) or type(e).__name__ == "NoArgsIsHelpError":
        return e  # already restyled, or "gossiprouter" alone: that shows the help
    return _UsageError(e.format_message(), e.ctx)


class _Group(click.Group):
    """The main group: every usage error, its own or a subcommand's, in the one format."""

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as e:
            raise _restyled(e) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            raise _restyled(e) from None


@click.group(cls=_Group,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="gossiprouter")
def main() -> None:
    """gossiprouter: a TCP GossipRouter for group communication.

    A rendezvous and relay: clients register logical addresses in groups,
    list the members of a group, and route messages to one member or the
    whole group. Speaks its own msgpack protocol and the JGroups 2.12 and
    3.6.5+/5.x GossipRouter protocols on the same port.
    """


@main.command(cls=_SectionedCommand)
@click.option("--config", "config_file", type=click.Path(path_type=Path, dir_okay=False),
              help="TOML file setting any option below (the command line wins).")
@router_options
def serve(config_file: Path | None, **options: Any) -> None:
    """Run the router until SIGINT or SIGTERM.

    On a signal it stops accepting, tells every client (ERROR shutting_down),
    gives them --shutdown-timeout to receive what is queued, and exits 0.

    \b
    Examples:
      gossiprouter serve                          # 127.0.0.1:12001
      gossiprouter serve --host 0.0.0.0 --port 12001 --idle-timeout 30
      gossiprouter serve --config /etc/gossiprouter.toml --log-level debug
    """
    given = {k: v for k, v in options.items() if v is not None}
    try:
        fastpath.env_mode()
    except ConfigError as e:
        raise BadInput(str(e)) from None
    try:
        config = build(config_file, **given)
        check_startup(config)  # TLS files, tokens file: refused now, not after listening
        fastpath.status(config)  # fast_path on without the extension, a relay that won't load
    except ConfigError as e:
        raise CommandError(str(e)) from None
    setup_logging(config.log_level, config.log_format)
    try:
        # Built here, outside trio.run: what the server refuses (the fast path or the bridge
        # asked for but not installed) is one line, not a traceback through trio.
        ops = Operations(config)
        server = Server(config, hooks=ops)
    except ConfigError as e:
        raise CommandError(str(e)) from None
    try:
        trio.run(run_until_signal, ops, server)
    except BaseException as e:
        # Options only the server's parts check as they are built (the bridge's) are a user's
        # mistake as much as a taken port: one line, no traceback.
        failure = _find(e, (ListenError, ConfigError))
        if failure is not None:
            raise CommandError(str(failure)) from None
        raise
    except KeyboardInterrupt:  # a second Ctrl-C during shutdown
        sys.exit(130)


def _find(e: BaseException, kind: tuple[type[Exception], ...]) -> Exception | None:
    """The first ``kind`` exception in ``e`` or, for an exception group, inside it."""
    if isinstance(e, kind):
        return e
    if isinstance(e, BaseExceptionGroup):
        for sub in e.exceptions:
            found = _find(sub, kind)
            if found is not None:
                return found
    return None


# Set by scripts/run to its .venv: once the router listens, say what to type next.
NEXT_STEPS_ENV = "GOSSIPROUTER_NEXT_STEPS"


def _next_steps(venv: str, host: str, port: int) -> str:
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    where = format_hostport(host, port)
    return (f"gossiprouter: listening on {where}. In another terminal:\n"
            f"    . {venv}/bin/activate\n"
            f"    gossiprouter members {where} demo\n"
            f"    gossiprouter listen {where} demo")


async def run_until_signal(ops: Operations, server: Server) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(server.serve)
            venv = os.environ.get(NEXT_STEPS_ENV)
            if venv:
                click.echo(_next_steps(venv, host, port), err=True)

            async def on_signal() -> None:
                async for signum in signals:
                    log.info("received %s", signal.Signals(signum).name)
                    server.shutdown()
                    return

            nursery.start_soon(on_signal)
            nursery.start_soon(reload_on_sighup, ops)
            await server.wait_closed()
            nursery.cancel_scope.cancel()


def setup_logging(level: str, fmt: str = "text") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    use_log_format(fmt)


def _needs(cmd: click.Command, modules: tuple[str, ...], what: str, needs: str,
           extra: str) -> click.Command:
    """Check ``cmd``'s optional dependencies before it runs, and name what is missing the
    one way: the package the user knows and ``pip install 'gossiprouter[EXTRA]'`` (not a
    dependency of it that happened to be imported first, such as py4j for PySpark)."""
    run = cmd.callback
    assert run is not None

    @functools.wraps(run)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if any(importlib.util.find_spec(m) is None for m in modules):
            raise CommandError(needs_extra(what, needs, extra))
        return run(*args, **kwargs)

    cmd.callback = checked
    return cmd


main.add_command(members_command)
main.add_command(send_command)
main.add_command(listen_command)
main.add_command(publish_command)
main.add_command(dump)
main.add_command(_needs(loadtest_command, ("pyarrow", "rich"), "the load test",
                        "pyarrow and rich", "loadtest"))
main.add_command(_needs(analyze_command, ("pyspark", "py4j"), "the analysis", "PySpark",
                        "loadtest"))
main.add_command(loadtest_topics_command)
