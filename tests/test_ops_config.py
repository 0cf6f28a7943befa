"""The new options: config file, command line, and refusals that name key, value, expectation."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gossiprouter.cli.main import main
from gossiprouter.core.config import Config, ConfigError, build
from gossiprouter.ops.runtime import check_startup
from tests.ops_client import tokens_file
from tests.test_ops_metrics import _router_port, _wait_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "docs" / "gossiprouter.example.toml"


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "router.toml"
    path.write_text(text)
    return path


def test_list_options_from_file_and_cli(tmp_path: Path) -> None:
    f = _file(tmp_path, 'allow_jgroups5 = ["10.0.0.0/8", "fd00::/8"]\njgroups = false\n'
                        'metrics = "127.0.0.1:9100"\nlog-format = "json"\n')
    cfg = build(f)
    assert cfg.allow_jgroups5 == ("10.0.0.0/8", "fd00::/8")
    assert cfg.allow_native == ("0.0.0.0/0", "::/0")
    assert cfg.jgroups is False and cfg.metrics == "127.0.0.1:9100"
    assert cfg.log_format == "json"
    # The command line wins, and a list option there is repeatable or comma-separated.
    cfg = build(f, allow_jgroups5=("192.168.0.0/16",), jgroups=True)
    assert cfg.allow_jgroups5 == ("192.168.0.0/16",) and cfg.jgroups is True


@pytest.mark.parametrize(("text", "message"), [
    ('allow_native = ["10.0.0.0/8", "10.0.0.1/8"]\n',
     "allow_native[1] = '10.0.0.1/8': expected a network in CIDR notation"),
    ('allow_jgroups2 = "10.0.0.0/8"\n',
     "allow_jgroups2 = '10.0.0.0/8': expected a list of strings (CIDR each)"),
    ('allow_jgroups5 = [10]\n', "allow_jgroups5[0] = 10: expected a string"),
    ('metrics = "localhost"\n', "metrics = 'localhost': expected HOST:PORT"),
    ('log_format = "xml"\n', "log_format = 'xml': expected one of text, json"),
    ('tls_require_client_cert = "yes"\n',
     "tls_require_client_cert = 'yes': expected true or false"),
    ('tls_certificate = "x.pem"\n', "unknown key 'tls_certificate'"),
])
def test_bad_values_are_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        build(_file(tmp_path, text))
    assert message in str(e.value)


def test_options_that_depend_on_each_other(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tls_client_ca = 'ca.pem': expected tls_cert"):
        check_startup(Config(tls_client_ca="ca.pem"))
    with pytest.raises(ConfigError, match=r"metrics = '127.0.0.1:12001': expected a port "
                                          r"other than the router's"):
        check_startup(Config(metrics="127.0.0.1:12001"))
    with pytest.raises(ConfigError, match=r"tokens_file .*missing.toml: not found"):
        check_startup(Config(tokens_file=str(tmp_path / "missing.toml")))
    with socket.create_server(("127.0.0.1", 0)) as taken:
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(ConfigError, match=rf"metrics = '{busy}': cannot listen there"):
            check_startup(Config(metrics=busy))


def test_cli_list_option_and_refusal(tmp_path: Path) -> None:
    """Through the real command line: one clear line on stderr, no traceback."""
    r = subprocess.run([sys.executable, "-m", "gossiprouter", "serve", "--port", "0",
                        "--allow-native", "127.0.0.0/8,10.0.0.0/8", "--allow-native",
                        "10.0.0.300/8"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "Traceback" not in r.stderr  # a usage error
    assert ("invalid value for '--allow-native': '10.0.0.300/8': expected a network in CIDR "
            "notation" in r.stderr), r.stderr
    r = subprocess.run([sys.executable, "-m", "gossiprouter", "serve", "--port", "0",
                        "--tls-cert", str(tmp_path / "none.pem")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert f"tls_cert = '{tmp_path / 'none.pem'}': file not found" in r.stderr
    # The help lists the new options.
    out = CliRunner().invoke(main, ["serve", "--help"]).output
    for flag in ("--metrics HOST:PORT", "--tls-cert FILE", "--allow-jgroups5 CIDR",
                 "--log-format", "--tokens-file FILE", "--no-jgroups"):
        assert flag in out


def test_example_config_is_accepted(tmp_path: Path) -> None:
    """docs/gossiprouter.example.toml starts a router (ports overridden to free ones)."""
    log_path = tmp_path / "router.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gossiprouter", "serve", "--config", str(EXAMPLE),
             "--port", "0", "--metrics", "127.0.0.1:0"],
            stderr=log_file, stdout=subprocess.DEVNULL)
    try:
        port = _router_port(_wait_for(log_path, "listening on "))
        _wait_for(log_path, "admin view on http://")
        deadline = time.monotonic() + 5
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, log_path.read_text()


def _doc_block(first_line: str) -> str:
    """The ```toml block of docs/operations.md that starts with ``first_line``."""
    text = (ROOT / "docs" / "operations.md").read_text()
    for block in text.split("```toml\n")[1:]:
        body = block.split("```", 1)[0]
        if body.startswith(first_line):
            return body
    raise AssertionError(f"no toml block starting {first_line!r}")


def test_documented_files_are_valid(tmp_path: Path) -> None:
    """The sample config and tokens file in the docs load as documented."""
    from gossiprouter.ops.auth import load_tokens

    cfg = build(_file(tmp_path, _doc_block("# /etc/gossiprouter/gossiprouter.toml")))
    assert cfg.allow_jgroups2 == () and cfg.tokens_file == "/etc/gossiprouter/tokens.toml"
    loaded = load_tokens(tokens_file(tmp_path, _doc_block("# tokens.toml")))
    assert loaded.patterns["billing"] == ("billing", "billing-*", "shared", "billing")
