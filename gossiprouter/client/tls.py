"""TLS for the client side: a verifying context, and wrapping a connected stream.

The stub (and tests, tools) build their context with :func:`client_context`; the router's
own TLS (ServerTLS, certificate reload) stays in :mod:`gossiprouter.ops.tls`, which
still resolves the old names ``gossiprouter.ops.tls.client_context`` / ``wrap_client``
(deprecated) to these.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import TYPE_CHECKING

from anyio.abc import ByteStream
from anyio.streams.tls import TLSStream

if TYPE_CHECKING:
    import trio


def client_context(ca: str | Path | None = None, cert: str | Path | None = None,
                   key: str | Path | None = None, *, cadata: str | None = None) -> ssl.SSLContext:
    """A client context that verifies the router against ``ca`` (a PEM file; None means the
    system's trust store), optionally presenting ``cert``/``key`` for mutual TLS."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca and str(ca),
                                     cadata=cadata)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        ctx.load_cert_chain(str(cert), None if key is None else str(key))
    return ctx


async def start_tls(stream: ByteStream, context: ssl.SSLContext,
                    server_hostname: str) -> TLSStream:
    """TLS over a connected AnyIO stream, handshake done: what the stub uses on any loop.

    ``server_hostname`` is the name (or IP) the router's certificate must be valid for.
    Raises ssl.SSLError (or anyio.BrokenResourceError from it) when the handshake fails.
    """
    return await TLSStream.wrap(stream, hostname=server_hostname, ssl_context=context)


async def wrap_client(stream: trio.abc.Stream, context: ssl.SSLContext,
                      server_hostname: str) -> trio.SSLStream[trio.abc.Stream]:
    """Wrap a connected *trio* stream in TLS and complete the handshake (for trio code
    that opens its own streams: tests, tools; the stub itself uses :func:`start_tls`).

    ``server_hostname`` is the name (or IP) the router's certificate must be
    valid for: the host the caller connected to. Raises trio.BrokenResourceError
    (its ``__cause__`` is the ssl.SSLError) when the handshake fails.
    """
    import trio  # only here: the client does not load trio on asyncio

    tls = trio.SSLStream(stream, context, server_hostname=server_hostname)
    await tls.do_handshake()
    return tls
