"""TLS for the router port and for clients (the stub, tests, tools).

The router side holds its :class:`ssl.SSLContext` in a :class:`ServerTLS`,
which builds a fresh context on :meth:`ServerTLS.reload` (SIGHUP) and swaps
it in: connections already up keep the context they were accepted with, new
ones get the new certificate. The client side (``client_context``, ``wrap_client``)
lives in :mod:`gossiprouter.client.tls`: ops does not import the client. The old names
``gossiprouter.ops.tls.client_context`` / ``wrap_client`` (deprecated since issue 14) are gone;
:func:`__getattr__` says where they went.
"""

from __future__ import annotations

import logging
import ssl

import trio

from gossiprouter.core.config import Config, ConfigError

log = logging.getLogger("gossiprouter.ops.tls")


def server_context(cert: str, key: str = "", client_ca: str = "",
                   require_client_cert: bool = False) -> ssl.SSLContext:
    """A server context: TLS 1.2 or later, ``cert``/``key``, optional client verification.

    Raises ConfigError naming the option and file when something cannot be loaded.
    """
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # load_cert_chain reports neither which file is missing (a missing key is an SSLError
    # "PEM lib", a missing cert a FileNotFoundError without a name), so each file is
    # opened first and a problem is reported against the option that names it.
    _readable("tls_cert", cert)
    if key:
        _readable("tls_key", key)
    try:
        ctx.load_cert_chain(cert, key or None)
    except (ssl.SSLError, OSError) as e:
        raise ConfigError(
            f"tls_cert = {cert!r}, tls_key = {key!r}: expected a PEM certificate chain and its "
            f"private key ({_reason(e)})"
        ) from None
    if client_ca:
        _readable("tls_client_ca", client_ca)
        try:
            ctx.load_verify_locations(cafile=client_ca)
        except (ssl.SSLError, OSError) as e:
            raise ConfigError(
                f"tls_client_ca = {client_ca!r}: expected PEM CA certificates ({_reason(e)})"
            ) from None
        # Without require, a client may omit its certificate, but one it sends must verify.
        ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _readable(option: str, path: str) -> None:
    """Raise ConfigError naming ``option`` when the file ``path`` cannot be opened."""
    try:
        with open(path, "rb"):
            pass
    except FileNotFoundError:
        raise ConfigError(f"{option} = {path!r}: file not found") from None
    except OSError as e:
        raise ConfigError(f"{option} = {path!r}: cannot read it ({e.strerror})") from None


def check_config(cfg: Config) -> None:
    """Refuse TLS options that make no sense together (before anything is loaded)."""
    if not cfg.tls_cert:
        for name in ("tls_key", "tls_client_ca"):
            if getattr(cfg, name):
                raise ConfigError(f"{name} = {getattr(cfg, name)!r}: expected tls_cert to be "
                                  "set too (TLS is off without a certificate)")
        if cfg.tls_require_client_cert:
            raise ConfigError("tls_require_client_cert = true: expected tls_cert and "
                              "tls_client_ca to be set too")
    elif cfg.tls_require_client_cert and not cfg.tls_client_ca:
        raise ConfigError("tls_require_client_cert = true: expected tls_client_ca (the CA that "
                          "signs client certificates) to be set too")


class ServerTLS:
    """The router's current server context, rebuilt from the same files on reload."""

    def __init__(self, cfg: Config) -> None:
        check_config(cfg)
        self.cert = cfg.tls_cert
        self.key = cfg.tls_key
        self.client_ca = cfg.tls_client_ca
        self.require_client_cert = cfg.tls_require_client_cert
        self.context = self._build()
        self.handshake_failures = 0
        self.reloads = 0

    def _build(self) -> ssl.SSLContext:
        return server_context(self.cert, self.key, self.client_ca, self.require_client_cert)

    def reload(self) -> None:
        """Build a new context from the files; on failure keep the old one and raise."""
        self.context = self._build()
        self.reloads += 1

    async def handshake(self, stream: trio.abc.Stream, peer: str) -> TLSStream | None:
        """Run the server handshake; None (logged at INFO) when the client fails it.

        A failed handshake concerns this connection only; the caller closes it.
        """
        tls = trio.SSLStream(stream, self.context, server_side=True)
        try:
            await tls.do_handshake()
        except trio.BrokenResourceError as e:
            self.handshake_failures += 1
            log.info("closing %s: TLS handshake failed: %s", peer, _reason(e.__cause__ or e),
                     extra={"peer": peer, "reason": "tls_handshake"})
            return None
        return TLSStream(tls)


class TLSStream(trio.abc.Stream):
    """A server-side trio.SSLStream whose ``receive_some`` is typed ``bytes``: the
    :class:`gossiprouter.server.hooks.ByteStream` the accept hook hands the server.

    The sessions take ``bytes``; SSLStream is annotated ``bytes | bytearray``
    though it returns the ``bytes`` of ssl.SSLObject.read. ``ssl`` is the
    SSLStream (for ``getpeercert()``, the negotiated version, ...).
    """

    __slots__ = ("ssl",)

    def __init__(self, ssl_stream: trio.SSLStream[trio.abc.Stream]) -> None:
        self.ssl = ssl_stream

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self.ssl.receive_some(max_bytes)
        return data if type(data) is bytes else bytes(data)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.ssl.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.ssl.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.ssl.aclose()


def _reason(e: BaseException | None) -> str:
    if isinstance(e, ssl.SSLError) and e.reason:
        return f"{e.reason} ({e.library or 'ssl'})" if e.library else str(e.reason)
    return str(e) or type(e).__name__


_MOVED = frozenset({"client_context", "wrap_client"})


def __getattr__(name: str) -> object:
    """The names that moved to gossiprouter.client.tls: an AttributeError that says where (the
    deprecated aliases were removed by issue 28, so that ops imports nothing of the client)."""
    if name in _MOVED:
        raise AttributeError(f"gossiprouter.ops.tls.{name} moved to "
                             f"gossiprouter.client.tls.{name} (the old name was removed)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
