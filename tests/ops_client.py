"""Test helpers for the operations tests: the raw native client (tests/nclient.py, which
speaks TLS and sends tokens) under its old name, a tiny HTTP GET, and a tokens file."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.nclient import NativeClient

# The raw client of tests/nclient.py speaks TLS and sends tokens too.
OpsClient = NativeClient


def tokens_file(directory: Path, text: str) -> Path:
    """``directory/tokens.toml`` holding ``text``, readable by its owner only: the router
    warns about a file of plain tokens that others can read."""
    path = directory / "tokens.toml"
    path.write_text(text)
    path.chmod(0o600)
    return path


async def http_get(address: tuple[str, int], path: str, method: str = "GET",
                   timeout: float = 5.0, extra: str = "") -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request (``extra``: more header lines, each ending in CRLF); returns
    (status, headers with lower-case names, body)."""
    with trio.fail_after(timeout):
        stream = await trio.open_tcp_stream(*address)
        async with stream:
            await stream.send_all(
                f"{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
            raw = b""
            while data := await stream.receive_some(65536):
                raw += data
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip()
               for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return status, headers, body


async def assert_closed(stream: trio.abc.ReceiveStream, timeout: float = 5.0) -> None:
    """Read until the peer closes (EOF, or a reset: both are a clean close here)."""
    with trio.fail_after(timeout):
        try:
            while await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
