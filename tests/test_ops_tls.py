"""TLS on the router port: plain TLS, mutual TLS, plain-text clients, SIGHUP reload."""

from __future__ import annotations

import logging
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trustme

from gossiprouter.client.tls import client_context, wrap_client
from gossiprouter.core.config import ConfigError
from gossiprouter.protocol import native as wire
from tests.conftest import RouterFactory
from tests.ops_client import OpsClient, assert_closed
from tests.test_ops_metrics import _router_port, _wait_for, scrape, v


def _server_files(tmp_path: Path, ca: trustme.CA, name: str = "server") -> tuple[Path, Path]:
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    cert.cert_chain_pems[0].write_to_path(cert_path)
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(cert_path, append=True)
    cert.private_key_pem.write_to_path(key_path)
    return cert_path, key_path


def _ca_file(tmp_path: Path, ca: trustme.CA, name: str) -> Path:
    path = tmp_path / f"{name}-ca.pem"
    ca.cert_pem.write_to_path(path)
    return path


async def _raw_until_closed(host: str, port: int, data: bytes) -> bytes:
    """Send ``data`` in plain text and read until the router closes the connection."""
    got = b""
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            await stream.send_all(data)
            try:
                while chunk := await stream.receive_some(65536):
                    got += chunk
            except trio.BrokenResourceError:  # a reset is a clean close too
                pass
    return got


async def test_tls_and_a_plain_text_client(start_router: RouterFactory, tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gossiprouter")
    ca = trustme.CA()
    cert, key = _server_files(tmp_path, ca)
    server = await start_router(tls_cert=str(cert), tls_key=str(key), metrics="127.0.0.1:0")
    assert server.address is not None
    host, port = server.address
    ctx = client_context(_ca_file(tmp_path, ca, "server"))
    a = await OpsClient.open(host, port, ssl_context=ctx)
    b = await OpsClient.open(host, port, ssl_context=ctx)
    assert await a.connect("g", b"A") == wire.Ok(1)
    assert await b.connect("g", b"B") == wire.Ok(1)

    # A plain-text native client on the TLS port: closed, nothing else disturbed.
    got = await _raw_until_closed(host, port, wire.PREAMBLE + wire.encode(wire.Hello((1,), "x")))
    assert not got.startswith(wire.PREAMBLE) and b"WELCOME" not in got
    assert any("TLS handshake failed" in r.getMessage() and r.levelno == logging.INFO
               for r in caplog.records)
    await a.send(wire.Route("g", b"B", b"A", b"still here"))
    assert await b.recv() == wire.Route("g", b"B", b"A", b"still here")

    # A client that does not trust the router's certificate fails its handshake.
    with pytest.raises(trio.BrokenResourceError) as exc:
        await OpsClient.open(host, port, ssl_context=client_context(
            _ca_file(tmp_path, trustme.CA(), "other")))
    assert isinstance(exc.value.__cause__, ssl.SSLCertVerificationError)

    s = await scrape(server)
    assert v(s, "gossiprouter_tls_handshake_failures_total") == 2
    assert v(s, "gossiprouter_connections", protocol="native") == 2


async def test_mutual_tls(start_router: RouterFactory, tmp_path: Path) -> None:
    ca, client_ca = trustme.CA(), trustme.CA()
    cert, key = _server_files(tmp_path, ca)
    server = await start_router(tls_cert=str(cert), tls_key=str(key),
                                tls_client_ca=str(_ca_file(tmp_path, client_ca, "clients")),
                                tls_require_client_cert=True)
    assert server.address is not None
    host, port = server.address
    server_ca = _ca_file(tmp_path, ca, "server")

    good = client_ca.issue_cert("member-1@example.org")
    good_pem = tmp_path / "client.pem"
    good.private_key_and_cert_chain_pem.write_to_path(good_pem)
    c = await OpsClient.open(host, port, ssl_context=client_context(server_ca, good_pem))
    assert await c.connect("g", b"C") == wire.Ok(1)

    # No client certificate, or one from another CA: refused (at the handshake, or with
    # TLS 1.3 right after it, when the client first reads).
    rogue = trustme.CA().issue_cert("intruder@example.org")
    rogue_pem = tmp_path / "rogue.pem"
    rogue.private_key_and_cert_chain_pem.write_to_path(rogue_pem)
    for ctx in (client_context(server_ca), client_context(server_ca, rogue_pem)):
        with pytest.raises((trio.BrokenResourceError, EOFError)):
            await OpsClient.open(host, port, ssl_context=ctx)
    # The good client was not disturbed.
    assert await c.member_addrs("g") == [b"C"]


async def test_sniffing_after_tls(start_router: RouterFactory, tmp_path: Path) -> None:
    """JGroups 5.x TUNNEL over TLS: the protocol is told from the decrypted bytes."""
    ca = trustme.CA()
    cert, key = _server_files(tmp_path, ca)
    server = await start_router(tls_cert=str(cert), tls_key=str(key), metrics="127.0.0.1:0",
                                jgroups=False)
    assert server.address is not None
    ctx = client_context(_ca_file(tmp_path, ca, "server"))
    stream = await trio.open_tcp_stream(*server.address)
    tls = await wrap_client(stream, ctx, "127.0.0.1")
    await tls.send_all(b"\x00\x00\x00\x10" + b"\x00" * 16)  # a JGroups 5 frame header
    await assert_closed(tls)
    await trio.aclose_forcefully(tls)
    s = await scrape(server)
    assert v(s, "gossiprouter_connections_refused_total", protocol="jgroups5",
             reason="disabled") == 1


def test_tls_config_errors(tmp_path: Path) -> None:
    from gossiprouter.core.config import Config
    from gossiprouter.ops.runtime import check_startup

    with pytest.raises(ConfigError, match=r"tls_cert = '/nonexistent.pem': file not found"):
        check_startup(Config(tls_cert="/nonexistent.pem"))
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"expected a PEM certificate chain and its private"):
        check_startup(Config(tls_cert=str(bad)))
    with pytest.raises(ConfigError, match=r"tls_key = 'k.pem': expected tls_cert to be set"):
        check_startup(Config(tls_key="k.pem"))
    with pytest.raises(ConfigError, match=r"tls_require_client_cert = true: expected "
                                          r"tls_client_ca"):
        check_startup(Config(tls_cert=str(bad), tls_require_client_cert=True))


def test_sighup_reloads_the_certificate(tmp_path: Path) -> None:
    """Replace the cert files, SIGHUP: new connections see the new certificate, old ones
    keep working."""
    ca = trustme.CA()
    cert, key = _server_files(tmp_path, ca)
    ctx = client_context(_ca_file(tmp_path, ca, "server"))
    log_path = tmp_path / "router.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gossiprouter", "serve", "--port", "0",
             "--tls-cert", str(cert), "--tls-key", str(key)],
            stderr=log_file, stdout=subprocess.DEVNULL)
    try:
        port = _router_port(_wait_for(log_path, "listening on "))

        async def peer_cert(c: OpsClient) -> bytes:
            assert isinstance(c.stream, trio.SSLStream)
            der = c.stream.getpeercert(binary_form=True)
            assert isinstance(der, bytes)
            return der

        async def check() -> None:
            old = await OpsClient.open("127.0.0.1", port, ssl_context=ctx)
            first = await peer_cert(old)
            # Replace both files (a new key too) with a freshly issued certificate.
            _server_files(tmp_path, ca)
            proc.send_signal(signal.SIGHUP)
            await trio.to_thread.run_sync(_wait_for, log_path, "reloaded TLS certificate")
            new = await OpsClient.open("127.0.0.1", port, ssl_context=ctx)
            second = await peer_cert(new)
            assert second != first
            assert second == ssl.PEM_cert_to_DER_cert(
                cert.read_text().split("-----END CERTIFICATE-----")[0]
                + "-----END CERTIFICATE-----\n")
            # The connection made before the reload is still up.
            assert await old.connect("g", b"OLD") == wire.Ok(1)
            assert await new.connect("g", b"NEW") == wire.Ok(1)
            await old.aclose()
            await new.aclose()

        trio.run(check)
        # A broken file on reload: logged, the old certificate stays.
        cert.write_text("garbage")
        proc.send_signal(signal.SIGHUP)
        _wait_for(log_path, "TLS reload failed, keeping the current certificate")

        async def still_serving() -> None:
            c = await OpsClient.open("127.0.0.1", port, ssl_context=ctx)
            await c.aclose()

        trio.run(still_serving)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


def test_moved_client_helpers_say_where_they_went() -> None:
    # Issue 14 item 3 moved the client's TLS set-up to gossiprouter.client.tls; issue 28 removed
    # the deprecated aliases (ops imports nothing of the client). The old path fails with the
    # new one in its message, not with a bare AttributeError.
    from gossiprouter.client import tls as client_tls
    from gossiprouter.ops import tls as ops_tls

    for name in ("client_context", "wrap_client"):
        assert callable(getattr(client_tls, name))
        with pytest.raises(AttributeError, match=f"gossiprouter.client.tls.{name}"):
            getattr(ops_tls, name)
    with pytest.raises(AttributeError, match="no_such_name"):
        ops_tls.no_such_name  # noqa: B018
