"""The ``gossiprouter`` command line (click): parses options, builds a Config, calls in.

Every user mistake (a bad option, a taken port, an unreachable router) ends in
one clear line on stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Any

import click
import trio

from gossiprouter import __version__
from gossiprouter.analytics.cli import analyze_command
from gossiprouter.config import OPTIONS, Config, ConfigError, Option, build
from gossiprouter.loadtest.cli import loadtest_command
from gossiprouter.loadtest.topics import loadtest_topics_command
from gossiprouter.ops.dump import dump
from gossiprouter.ops.logs import use_format as use_log_format
from gossiprouter.ops.runtime import check_startup, reload_on_sighup
from gossiprouter.server import ListenError, Server
from gossiprouter.tools import listen_command, members_command, publish_command, send_command

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


def _list_value(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> Any:
    # Not given -> None, so the config file's value stands (click gives () by default).
    items = tuple(s.strip() for v in value for s in v.split(",") if s.strip())
    return items or None


def router_options(f: Any) -> Any:
    """Add one click option per router option in :data:`gossiprouter.config.OPTIONS`."""
    for o in reversed(OPTIONS):
        if o.type is bool:
            name = o.name.replace("_", "-")
            decl = f"--{name}/--no-{name}"
            f = click.option(decl, o.name, default=None, help=_help(o))(f)
        elif o.type is tuple:  # a list option: repeatable
            f = click.option(o.flag, o.name, multiple=True, callback=_list_value,
                             metavar=_metavar(o), help=_help(o))(f)
        else:
            f = click.option(o.flag, o.name, type=_click_type(o), default=None, metavar=_metavar(o),
                             help=_help(o))(f)
    return f


def _metavar(o: Option) -> str:
    if o.metavar:
        return o.metavar
    if o.choices:
        return "[" + "|".join(o.choices) + "]"
    return {int: "INT", float: "SECONDS" if o.unit == "seconds" else "NUM", str: "TEXT"}[o.type]


class _Fail(click.ClickException):
    def show(self, file: Any = None) -> None:
        click.echo(f"gossiprouter: error: {self.message}", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="gossiprouter")
def main() -> None:
    """gossiprouter: a TCP GossipRouter for group communication.

    A rendezvous and relay: clients register logical addresses in groups,
    list the members of a group, and route messages to one member or the
    whole group. Speaks its own msgpack protocol and the JGroups 2.12 and
    3.6.5+/5.x GossipRouter protocols on the same port.
    """


@main.command()
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
        config = build(config_file, **given)
        check_startup(config)  # TLS files, tokens file: refused now, not after listening
    except ConfigError as e:
        raise _Fail(str(e)) from None
    setup_logging(config.log_level, config.log_format)
    try:
        trio.run(run_until_signal, config)
    except BaseException as e:
        failure = _find(e, ListenError)
        if failure is not None:
            raise _Fail(str(failure)) from None
        raise
    except KeyboardInterrupt:  # a second Ctrl-C during shutdown
        sys.exit(130)


def _find(e: BaseException, kind: type[ListenError]) -> ListenError | None:
    """The first ``kind`` exception in ``e`` or, for an exception group, inside it."""
    if isinstance(e, kind):
        return e
    if isinstance(e, BaseExceptionGroup):
        for sub in e.exceptions:
            found = _find(sub, kind)
            if found is not None:
                return found
    return None


async def run_until_signal(config: Config) -> None:
    server = Server(config)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)

            async def on_signal() -> None:
                async for signum in signals:
                    log.info("received %s", signal.Signals(signum).name)
                    server.shutdown()
                    return

            nursery.start_soon(on_signal)
            nursery.start_soon(reload_on_sighup, server)
            await server.wait_closed()
            nursery.cancel_scope.cancel()


def setup_logging(level: str, fmt: str = "text") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    use_log_format(fmt)


def run() -> None:  # pragma: no cover - console-script shim
    main()


main.add_command(members_command)
main.add_command(send_command)
main.add_command(listen_command)
main.add_command(publish_command)
main.add_command(dump)
main.add_command(loadtest_command)
main.add_command(loadtest_topics_command)
main.add_command(analyze_command)
