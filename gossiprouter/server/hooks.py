"""What the server asks of the layer around it: the :class:`ServerHooks` Protocol.

The server calls its hooks at a connection's few decision points and never imports who
implements them: :class:`gossiprouter.ops.runtime.Operations` (TLS, allow-lists, tokens,
the metrics/admin port) is the router's, built by whoever builds the server (``gossiprouter
serve``, :class:`gossiprouter.router.Router`) and handed in. Without hooks the server uses
:class:`NoHooks`: plain TCP, everyone admitted, no tokens; it then refuses a config that asks
for what only hooks provide (:func:`needs_hooks`), rather than ignore, say, ``tls_cert``.

Nothing here runs per frame: the hooks are called once or twice per connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import trio

from gossiprouter.core.config import OPTIONS, Config

if TYPE_CHECKING:
    from gossiprouter.server.snapshot import RouterView
    from gossiprouter.sessions.base import Authority

# Options served by the hooks (gossiprouter.ops), not by the server itself.
HOOK_OPTIONS = ("metrics", "admin_token", "tls_cert", "tls_key", "tls_client_ca",
                "tls_require_client_cert", "tokens_file", "jgroups", "allow_native",
                "allow_jgroups2", "allow_jgroups5")


class ByteStream(Protocol):
    """The stream a connection is read from and written to once an accept hook has run: the
    socket stream itself, or TLS over it (``gossiprouter.ops.tls.TLSStream``). The sessions
    take ``bytes``, so ``receive_some`` returns bytes (trio.SSLStream's may be a bytearray)."""

    async def receive_some(self, max_bytes: int | None = None) -> bytes: ...

    async def send_all(self, data: bytes | bytearray | memoryview) -> None: ...

    async def aclose(self) -> None: ...


class ServerHooks(Protocol):
    """The decision points of a connection's life that belong to operations.

    * :meth:`accept`: a connection was accepted, before its first byte is read;
    * :meth:`admit`: its first bytes said which protocol it speaks;
    * :meth:`refused`: the server closed it at accept for a limit of its own;
    * :attr:`auth`: the token authority the native sessions ask (``Hub.auth``);
    * :meth:`serve`: the hooks' own tasks, in the server's nursery, with a read-only
      :class:`~gossiprouter.server.snapshot.RouterView` of the server.
    """

    @property
    def auth(self) -> Authority | None: ...

    async def serve(self, view: RouterView, *, task_status: trio.TaskStatus[
            tuple[str, int] | None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; ``started()`` with the address of an endpoint of the hooks'
        own (the metrics/admin port), or None."""
        ...

    async def accept(self, stream: trio.SocketStream, peer: str) -> ByteStream | None:
        """The stream to read the connection from (``stream`` or TLS over it), or None to
        close it at once (the hooks log why)."""
        ...

    async def admit(self, peer: str, protocol: str) -> str | None:
        """None admits ``peer`` speaking ``protocol``; else why not (the hooks log it, the
        server tells a native client as ERROR ``unauthorized`` and closes). May wait, within
        the handshake deadline."""
        ...

    def refused(self, peer: str, reason: str) -> None:
        """The server closed ``peer``'s connection at accept, unread: ``reason`` is
        ``limit`` (max_connections) or ``limit_per_ip`` (max_connections_per_ip)."""
        ...


class NoHooks:
    """A server on its own: plain TCP, every peer and protocol admitted, no tokens."""

    auth: Authority | None = None

    async def serve(self, view: RouterView, *, task_status: trio.TaskStatus[
            tuple[str, int] | None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(None)

    async def accept(self, stream: trio.SocketStream, peer: str) -> ByteStream | None:
        return stream

    async def admit(self, peer: str, protocol: str) -> str | None:
        return None

    def refused(self, peer: str, reason: str) -> None:
        pass  # the server logs it; counting refusals is the metrics' job, and there are none


def needs_hooks(config: Config) -> list[str]:
    """The options of ``config`` that only hooks can serve, set away from their defaults."""
    defaults = {o.name: o.default for o in OPTIONS}
    return [n for n in HOOK_OPTIONS if getattr(config, n) != defaults[n]]
