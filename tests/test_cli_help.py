"""``gossiprouter serve --help``: its options grouped under headings (issue 31), each still with
its one-line text, every option under the heading core/options.py gives it."""

from __future__ import annotations

import re

from click.testing import CliRunner

from gossiprouter.cli.main import _help, main
from gossiprouter.core.config import OPTIONS
from gossiprouter.core.options import OTHER, SECTIONS

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
