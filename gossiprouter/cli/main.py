"""The ``gossiprouter`` command line (click): the main group, which loads each subcommand's
module only when that command runs, and the one style of every usage error.

Every user mistake (a bad option, a taken port, an unreachable router) ends in
one clear line on stderr and a non-zero exit status, never a traceback.

The subcommands live beside what they drive (``cli/serve.py``, ``client/cli.py``,
``ops/dump.py``, ``loadtest/``, ``analytics/cli.py``); :data:`COMMANDS` names them with the line
``gossiprouter --help`` shows, so that neither the help nor a command imports the server or the
other commands (``gossiprouter analyze`` starts Spark without loading the router first).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any, Final

import click

from gossiprouter import __version__
from gossiprouter.core.cli_errors import PREFIX, CommandError, needs_extra


@dataclass(frozen=True)
class LazyCommand:
    """A subcommand by where it lives, and the line the main help shows for it (the first
    paragraph of its help; tests/test_cli_help.py checks it against the command's own)."""

    module: str
    attribute: str
    summary: str
    hidden: bool = False
    # The optional packages it needs: (modules, what, their names, the extra to install).
    needs: tuple[tuple[str, ...], str, str, str] | None = None


COMMANDS: dict[str, LazyCommand] = {
    "analyze": LazyCommand(
        "gossiprouter.analytics.cli", "analyze_command",
        "Audit the load-test run in RUN_DIR (a path or a Hadoop URI) with Apache Spark.",
        needs=(("pyspark", "py4j"), "the analysis", "PySpark", "loadtest")),
    "dump": LazyCommand("gossiprouter.ops.dump", "dump",
                        "Print a running router's groups, or the members of GROUP."),
    "listen": LazyCommand("gossiprouter.client.cli", "listen_command",
                          "Print GROUP's messages and membership events until Ctrl-C."),
    "loadtest": LazyCommand(
        "gossiprouter.loadtest.cli", "loadtest_command",
        "Run the load-test SCENARIO (a TOML file) and write the run to RUN_DIR.",
        needs=(("pyarrow", "rich"), "the load test", "pyarrow and rich", "loadtest")),
    "loadtest-topics": LazyCommand(
        "gossiprouter.loadtest.topics", "loadtest_topics_command",
        "The old name of `gossiprouter loadtest` for a topics scenario (kept for scripts).",
        hidden=True),
    "members": LazyCommand("gossiprouter.client.cli", "members_command",
                           "List the members of GROUP (without joining it)."),
    "publish": LazyCommand("gossiprouter.client.cli", "publish_command",
                           "Join GROUP, publish PAYLOAD (UTF-8) to the multicast ID, and leave."),
    "send": LazyCommand("gossiprouter.client.cli", "send_command",
                        "Join GROUP, send TEXT (UTF-8) to the group or to one member, and leave."),
    "serve": LazyCommand("gossiprouter.cli.serve", "serve",
                         "Run the router until SIGINT or SIGTERM."),
}
# What `gossiprouter --help` lists, and a mistyped command is matched against.
_VISIBLE: Final = tuple(sorted(name for name, c in COMMANDS.items() if not c.hidden))


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

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def resolve_command(self, ctx: click.Context, args: list[str]
                        ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as e:
            # Click suggests among the commands loaded so far: among every one shown here.
            raise click.exceptions.NoSuchCommand(e.command_name, possibilities=_VISIBLE,
                                                 ctx=ctx) from None

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self.add_command(load(cmd_name), cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Click's own listing, of stand-ins that carry each command's line from
        :data:`COMMANDS`: nothing is imported."""
        stand_ins = click.Group(commands=[click.Command(name, help=COMMANDS[name].summary)
                                          for name in _VISIBLE])
        stand_ins.format_commands(ctx, formatter)


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


@functools.cache
def load(name: str) -> click.Command:
    """The subcommand ``name`` of :data:`COMMANDS`, its module imported now (once: its
    optional dependencies' check wraps its callback)."""
    lazy = COMMANDS[name]
    cmd: click.Command = getattr(importlib.import_module(lazy.module), lazy.attribute)
    return cmd if lazy.needs is None else _needs(cmd, *lazy.needs)


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
