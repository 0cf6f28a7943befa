"""``gossiprouter serve``: the router's options as click options (one per
:data:`gossiprouter.core.config.OPTIONS`, under the headings of
:data:`gossiprouter.core.options.SECTIONS`), the config built from them, and the server run
until a signal. Loaded only when ``serve`` runs (or its help is shown): the other commands do
not import the server.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import click
import trio

from gossiprouter.core.addresses import format_hostport
from gossiprouter.core.cli_errors import BadInput, CommandError
from gossiprouter.core.config import OPTIONS, ConfigError, build, check
from gossiprouter.core.options import SECTIONS, Option
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



@click.command(cls=_SectionedCommand)
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
