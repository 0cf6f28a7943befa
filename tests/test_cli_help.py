"""``gossiprouter serve --help``: its options grouped under headings (issue 31), each still with
its one-line text, every option under the heading core/options.py gives it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click
from click.testing import CliRunner

from gossiprouter.cli.main import COMMANDS, load, main
from gossiprouter.cli.serve import _help
from gossiprouter.core.config import OPTIONS
from gossiprouter.core.options import OTHER, SECTIONS

ROOT = Path(__file__).resolve().parent.parent
HEADINGS = ["Options", "Listening and connections", "Limits", "JGroups",
            "TLS and authentication", "Federation (MQTT bridge)", "Operations"]


def serve_help() -> dict[str, str]:
    """``serve --help`` cut at its headings (a line ``Heading:`` at the margin): heading ->
    the text under it, its whitespace made single spaces (click wraps lines)."""
    r = CliRunner().invoke(main, ["serve", "--help"], terminal_width=100)
    assert r.exit_code == 0, r.output
    sections: dict[str, str] = {}
    heading = ""
    for line in r.output.splitlines():
        if m := re.fullmatch(r"(\S.*):", line):
            heading = m.group(1)
            assert heading not in sections, f"{heading} twice"
            sections[heading] = ""
        elif heading:
            sections[heading] += "\n" + line.strip()
    # (click also breaks a line after a hyphen: "HMAC-" then "SHA256")
    return {h: " ".join(re.sub(r"-\n", "-", text).split()) for h, text in sections.items()}


def test_serve_help_groups_the_options_under_headings_in_order() -> None:
    sections = serve_help()
    assert list(sections) == HEADINGS
    assert "--config FILE" in sections["Options"] and "--help" in sections["Options"]


def test_every_option_is_under_its_heading_with_its_whole_one_line_text() -> None:
    sections = serve_help()
    for o in OPTIONS:
        assert o.section in SECTIONS and o.section != OTHER, \
            f"{o.name}: give it a heading in core/options.py (_SECTION_OF)"
        text = sections[o.section]
        assert re.search(rf"(^| ){re.escape(o.flag)} ", text), (o.name, o.section)
        # Its help, unit and default, as before the grouping (only wrapped differently).
        assert " ".join(_help(o).split()) in text, o.name
        others = [h for h, t in sections.items() if h != o.section
                  and re.search(rf"(^| ){re.escape(o.flag)} ", t)]
        assert not others, (o.name, others)


# --- The main group loads each command only when it runs -----------------------------------


def test_the_main_help_shows_each_commands_own_first_line() -> None:
    """``gossiprouter --help`` is written from COMMANDS without importing a command: each line
    there must be the one click makes from the command's own help, at any width."""
    for name, lazy in COMMANDS.items():
        cmd = load(name)
        assert cmd.hidden == lazy.hidden, name
        for limit in (30, 45, 70, 200):
            assert click.Command(name, help=lazy.summary).get_short_help_str(limit) == \
                cmd.get_short_help_str(limit), (name, limit)


_IMPORTS = """
import sys
from click.testing import CliRunner
from gossiprouter.cli.main import main
r = CliRunner().invoke(main, sys.argv[1:])
assert r.exit_code == 0, r.output
print(" ".join(m for m in ("trio", "anyio", "gossiprouter.server.listener",
                           "gossiprouter.client.front", "gossiprouter.analytics.cli")
               if m in sys.modules))
"""


def imported(*argv: str) -> set[str]:
    """Which of a few heavy modules ``gossiprouter ARGV`` imported (a fresh interpreter)."""
    r = subprocess.run([sys.executable, "-c", _IMPORTS, *argv], capture_output=True,
                       text=True, check=False, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


def test_help_and_other_commands_do_not_import_the_router() -> None:
    assert imported("--help") == set()
    assert imported("analyze", "--help") == {"gossiprouter.analytics.cli"}
    assert imported("members", "--help") >= {"trio", "gossiprouter.client.front"}
    assert "gossiprouter.server.listener" not in imported("members", "--help")
    assert "gossiprouter.server.listener" in imported("serve", "--help")


def test_a_mistyped_command_is_matched_against_every_command() -> None:
    """Click suggests only among the commands it has loaded; the group loads them on use, so
    it suggests among all of them itself (never the hidden ``loadtest-topics``)."""
    for typed, want in (("serv", "no such command 'serv'. Did you mean 'serve'?"),
                        ("lisen", "no such command 'lisen'. (Did you mean one of: 'listen', "
                                  "'send'?)"),
                        ("loadtst", "no such command 'loadtst'. Did you mean 'loadtest'?"),
                        ("nothing-like-it", "no such command 'nothing-like-it' ")):
        r = CliRunner().invoke(main, [typed])
        assert r.exit_code == 2, r.output
        assert r.output.startswith(f"gossiprouter: error: {want}"), r.output
