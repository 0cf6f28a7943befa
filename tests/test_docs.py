"""The docs name real tests and real options."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.test_routing_rules import CASES

ROOT = Path(__file__).resolve().parent.parent


def _test_names() -> set[str]:
    names = set()
    for f in (ROOT / "tests").rglob("test_*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
    names |= {f"test_rule[{c.name}]" for c in CASES}
    return names


def test_every_routing_rule_names_existing_tests() -> None:
    text = (ROOT / "docs" / "routing.md").read_text()
    rows = [line for line in text.splitlines() if re.match(r"\| R\d+ \|", line)]
    assert len(rows) >= 14
    known = _test_names()
    for row in rows:
        cited = re.findall(r"`(test_[^`]+)`", row.rsplit("|", 2)[-2])
        assert cited, f"rule without a test: {row[:60]}"
        missing = [c for c in cited if c not in known]
        assert not missing, f"{row[:8]} cites unknown tests {missing}"


def test_operations_options_table_is_current() -> None:
    from gossiprouter.config import options_markdown

    text = (ROOT / "docs" / "operations.md").read_text()
    start = text.index("-->\n", text.index("<!-- options-table")) + 4
    table = text[start : text.index("<!-- /options-table -->")]
    assert table == options_markdown(), (
        "docs/operations.md options table is stale; replace it with:\n" + options_markdown())


def test_every_error_code_is_documented() -> None:
    """Every ERROR code the router can send appears in docs/protocol.md §8."""
    import re as _re

    codes = set()
    for f in (ROOT / "gossiprouter").rglob("*.py"):
        codes |= set(_re.findall(r'(?:RoutingError|ProtocolError|_error|close|_fail)\([^)]*?"'
                                 r'([a-z_]+)"', f.read_text()))
    codes |= {"protocol", "frame_too_large"}
    doc = (ROOT / "docs" / "protocol.md").read_text()
    section = doc[doc.index("## 8. Error codes") :]
    documented = set(_re.findall(r"^\| `([a-z_]+)`", section, _re.M))
    missing = {c for c in codes if c not in documented and c in {
        "protocol", "frame_too_large", "unsupported_version", "unauthorized", "idle_timeout",
        "slow_consumer", "shutting_down", "limit", "not_member", "unknown_destination",
        "address_in_use", "forbidden"}}
    assert not missing
    assert {"slow_consumer", "not_member", "address_in_use", "forbidden"} <= documented
