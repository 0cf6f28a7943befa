"""The docs name real tests and real options."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

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
    from gossiprouter.core.config import options_markdown

    text = (ROOT / "docs" / "operations.md").read_text()
    start = text.index("-->\n", text.index("<!-- options-table")) + 4
    table = text[start : text.index("<!-- /options-table -->")]
    assert table == options_markdown(), (
        "docs/operations.md options table is stale; replace it with:\n" + options_markdown())


def test_metric_label_codes_are_the_documented_codes() -> None:
    """The close reasons and refusal codes metrics label by (ERROR_CODES; anything else is
    "other") are exactly docs/protocol.md §8's codes: a new code gets its own label."""
    from gossiprouter.protocol.errors import ERROR_CODES

    doc = (ROOT / "docs" / "protocol.md").read_text()
    section = doc[doc.index("## 8. Error codes") :]
    section = section[: section.index("\n## ", 1)]
    assert set(re.findall(r"^\| `([a-z_]+)`", section, re.M)) == ERROR_CODES


# Where the router sends an ERROR, and which argument is its code: RoutingError(code, msg),
# encode_error(req, code, msg), Session._error(req, code, msg), Session.close(code, msg),
# Session.farewell(code, msg), and ProtocolError(msg, code=...) (code "protocol" by default).
_CODE_ARG = {"RoutingError": 0, "encode_error": 1, "_error": 1, "close": 0, "farewell": 0}
# The router core: what a client's connection can hear from (not the client, tools or loadtest).
_ROUTER_PARTS = ("server", "router.py", "routing", "sessions", "federation", "protocol", "ops")


def _strings(node: ast.expr, scope: ast.AST) -> set[str]:
    """The string values ``node`` can take: a literal, either side of ``a if c else b``, or a
    local name, through every assignment to it in ``scope``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return _strings(node.body, scope) | _strings(node.orelse, scope)
    if isinstance(node, ast.Name):
        return {s for a in ast.walk(scope) if isinstance(a, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == node.id for t in a.targets)
                for s in _strings(a.value, scope)}
    return set()


def router_error_codes() -> dict[str, set[str]]:
    """Every ERROR code the router can send, read from its code: code -> where it is sent."""
    codes: dict[str, set[str]] = {}
    for part in _ROUTER_PARTS:
        path = ROOT / "gossiprouter" / part
        for f in [path] if path.is_file() else sorted(path.rglob("*.py")):
            for fn in ast.walk(ast.parse(f.read_text())):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for call in ast.walk(fn):
                    if not isinstance(call, ast.Call):
                        continue
                    func = call.func
                    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                    if name == "ProtocolError":
                        kw = [k.value for k in call.keywords if k.arg == "code"]
                        found = _strings(kw[0], fn) if kw else {"protocol"}
                    elif name == "close" and len(call.args) < 2:
                        continue  # Outbox.close(reason): a reason for the log, nothing sent
                    elif name in _CODE_ARG and len(call.args) > _CODE_ARG[name]:
                        found = _strings(call.args[_CODE_ARG[name]], fn)
                    else:
                        continue
                    for code in found:
                        codes.setdefault(code, set()).add(
                            f"{f.relative_to(ROOT)}:{call.lineno}")
    return codes


def test_every_error_code_is_documented() -> None:
    """The codes the router can send and the codes docs/protocol.md §8 lists are the same set:
    a new code must be documented, and a documented code must still be sent."""
    codes = router_error_codes()
    # The extractor must see the sending paths it was written for, or the check is empty.
    assert {"protocol", "frame_too_large", "not_member", "slow_consumer",
            "shutting_down", "limit"} <= codes.keys(), sorted(codes)
    doc = (ROOT / "docs" / "protocol.md").read_text()
    section = doc[doc.index("## 8. Error codes") :]
    section = section[: section.index("\n## ", 1)]
    documented = set(re.findall(r"^\| `([a-z_]+)`", section, re.M))
    undocumented = {c: sorted(w) for c, w in codes.items() if c not in documented}
    assert not undocumented, f"ERROR codes missing from docs/protocol.md §8: {undocumented}"
    stale = documented - codes.keys()
    assert not stale, f"docs/protocol.md §8 lists codes the router never sends: {stale}"


def test_the_stub_knows_which_error_codes_close() -> None:
    """RouterStub's CLOSING_CODES (an unsolicited ERROR after which the router closes the
    connection: remembered as the reason instead of counted as an async error) are exactly
    the codes docs/protocol.md §8 marks "closed"."""
    from gossiprouter.client.model import CLOSING_CODES

    doc = (ROOT / "docs" / "protocol.md").read_text()
    section = doc[doc.index("## 8. Error codes") :]
    section = section[: section.index("\n## ", 1)]
    closing = set(re.findall(r"^\| `([a-z_]+)`[^|]*\| closed \|", section, re.M))
    assert {"protocol", "slow_consumer", "limit"} <= closing, closing  # the parse works
    assert set(CLOSING_CODES) == closing


def test_config_error_examples_are_the_real_messages(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/operations.md's examples of a bad config file are what serve prints today."""
    from click.testing import CliRunner

    from gossiprouter.cli.main import main

    doc = (ROOT / "docs" / "operations.md").read_text()
    monkeypatch.chdir(tmp_path)
    for content in ('idle_timeout = "soon"\n', "idle-timout = 5\n",
                    'allow_native = ["0.0.0.0/0", "10.0.0.1/8"]\n'):
        Path("router.toml").write_text(content)
        r = CliRunner().invoke(main, ["serve", "--config", "router.toml"])
        assert r.exit_code == 1
        assert f"\n    {r.stderr}" in doc, f"docs/operations.md should show: {r.stderr}"
