"""How every ``gossiprouter`` command reports a failure: one line on stderr,
``gossiprouter: error: ...``, and an exit status (1 failed, 2 bad input), never a traceback.

The click group in :mod:`gossiprouter.cli.main` prints click's own usage errors the same way,
so a bad option value reads like any other mistake.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, Final, NoReturn

import click

__all__ = ["PREFIX", "BadInput", "CommandError", "checkout", "fail", "install_hint",
           "needs_extra"]

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


def checkout() -> Path | None:
    """The source checkout this gossiprouter runs from (an editable install, or the
    repository on sys.path), or None for an installed copy."""
    root = Path(__file__).resolve().parents[2]
    try:
        project = (root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return None
    return root if 'name = "gossiprouter"' in project else None


def install_hint(extra: str) -> str:
    """The one way the errors tell how to get an optional part, as a command that works
    from where the user is: gossiprouter is not on a package index, so it is installed from
    its checkout (``scripts/setup`` installs every extra into the checkout's .venv)."""
    root = checkout()
    if root is None:
        return f"pip install '.[{extra}]' in a gossiprouter checkout"
    try:
        here: Path | None = Path.cwd().resolve()
    except OSError:  # the working directory was removed
        here = None
    where = "" if here == root else f"cd {shlex.quote(str(root))} && "
    pip = "pip"
    if Path(sys.prefix).resolve() == root / ".venv":
        pip = ".venv/bin/pip"  # whether or not the user activated it
    return f"{where}{pip} install -e '.[{extra}]' (or scripts/setup for everything)"


def needs_extra(what: str, needs: str, extra: str) -> str:
    """``the analysis needs PySpark: pip install -e '.[loadtest]' ...`` (install_hint).

    Names the package the user knows (PySpark), not whichever of its dependencies
    happened to be imported first (py4j).
    """
    return f"{what} needs {needs}: {install_hint(extra)}"
