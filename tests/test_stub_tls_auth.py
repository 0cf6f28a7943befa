"""The RouterStub over mutual TLS with a token, against a real router; on asyncio and trio."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import trustme

from gossiprouter import RouterStub
from gossiprouter.client.tls import client_context
from gossiprouter.stub import NotConnectedError
from tests.stubkit import RouterThreads, anyio_backend, start_router
from tests.test_ops_auth import BILLING, _tokens
from tests.test_ops_tls import _ca_file, _server_files

__all__ = ["anyio_backend", "start_router"]

pytestmark = pytest.mark.anyio


async def test_stub_mutual_tls_and_token(start_router: RouterThreads, tmp_path: Path) -> None:
    server_ca, client_ca = trustme.CA(), trustme.CA()
    cert, key = _server_files(tmp_path, server_ca)
    server = start_router(
        tls_cert=str(cert), tls_key=str(key), tls_client_ca=str(_ca_file(tmp_path, client_ca, "c")),
        tls_require_client_cert=True, tokens_file=str(_tokens(tmp_path)))
    ident = client_ca.issue_cert("client")
    ident.private_key_and_cert_chain_pem.write_to_path(tmp_path / "client.pem")
    ctx = client_context(ca=str(_ca_file(tmp_path, server_ca, "s")),
                         cert=str(tmp_path / "client.pem"), key=str(tmp_path / "client.pem"))
    async with RouterStub([server.address], ssl_context=ctx, token=BILLING) as a, \
            RouterStub([server.address], ssl_context=ctx, token=BILLING) as b:
        ca = await a.connect("billing", b"A", name="a")
        cb = await b.connect("billing", b"B", name="b")
        await ca.send(b"over tls", dest=b"B")
        with anyio.fail_after(5):
            msg = await cb.receive()
        assert (msg.sender, msg.payload) == (b"A", b"over tls")
        assert {m.addr for m in await ca.members()} == {b"A", b"B"}

    # Without a client certificate the handshake fails; sends say why.
    no_cert = client_context(ca=str(_ca_file(tmp_path, server_ca, "s")))
    async with RouterStub([server.address], ssl_context=no_cert, token=BILLING,
                          send_timeout=0.5, reconnect_initial=0.1) as c:
        with pytest.raises(NotConnectedError):
            await c.connect("billing", b"C")
    # A router whose certificate the client does not trust: the handshake fails, named.
    other_ca = client_context(ca=str(_ca_file(tmp_path, client_ca, "o")))
    async with RouterStub([server.address], ssl_context=other_ca, token=BILLING,
                          send_timeout=0.5, reconnect_initial=0.1) as e:
        with pytest.raises(NotConnectedError, match="TLS handshake failed"):
            await e.connect("billing", b"E")
    # A wrong token: refused, and the refusal is named.
    async with RouterStub([server.address], ssl_context=ctx, token="wrong",
                          send_timeout=0.5, reconnect_initial=0.1) as d:
        with pytest.raises(NotConnectedError, match="unauthorized"):
            await d.connect("billing", b"D")
