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
