"""How every ``gossiprouter`` command reports a failure: one line on stderr,
``gossiprouter: error: ...``, and an exit status (1 failed, 2 bad input), never a traceback.

The click group in :mod:`gossiprouter.cli` prints click's own usage errors the same way,
so a bad option value reads like any other mistake.
"""

from __future__ import annotations

from typing import Any, Final, NoReturn

import click

__all__ = ["PREFIX", "BadInput", "CommandError", "fail", "install_hint", "needs_extra"]

PREFIX: Final = "gossiprouter: error: "
EXIT_FAILED: Final = 1
EXIT_INPUT: Final = 2


class CommandError(click.ClickException):
    """A command failed: ``gossiprouter: error: MESSAGE`` on stderr, exit status 1."""

    def show(self, file: Any = None) -> None:
        click.echo(PREFIX + self.message, err=True)


class BadInput(CommandError):
    """A bad argument, option value or input file: exit status 2."""

    exit_code = EXIT_INPUT


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    """Print ``message`` the one way and exit with ``code`` (for commands whose exit
    statuses go beyond 1 and 2, such as ``analyze``'s 3)."""
    click.echo(PREFIX + message, err=True)
    raise SystemExit(code)


def install_hint(extra: str) -> str:
    """The one way the docs and the errors tell how to get an optional part."""
    return f"pip install 'gossiprouter[{extra}]'"


def needs_extra(what: str, needs: str, extra: str) -> str:
    """``the analysis needs PySpark: pip install 'gossiprouter[loadtest]'``.

    Names the package the user knows (PySpark), not whichever of its dependencies
    happened to be imported first (py4j).
    """
    return f"{what} needs {needs}: {install_hint(extra)}"
