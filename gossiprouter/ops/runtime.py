"""The glue between the server and the operations layer: the hooks the server calls.

:class:`Operations` is created by the :class:`~gossiprouter.server.Server`
from its Config and is the only ops object the server knows. The server calls:

* :meth:`Operations.serve` in its nursery (the metrics/admin HTTP port);
* :meth:`Operations.accept` once per accepted connection, before the first
  byte is read: the allow-list check on the peer IP, then the TLS handshake
  (the connection's stream becomes the TLS stream, so protocol sniffing
  happens on the decrypted bytes);
* :meth:`Operations.admit` once per connection when its protocol is known.

Nothing here runs per frame. :func:`check_startup` lets the CLI refuse bad
TLS files or tokens before it starts listening; :func:`reload_on_sighup`
is the CLI's SIGHUP handler.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from gossiprouter.config import Config, ConfigError, parse_listen
from gossiprouter.ops.access import AccessPolicy, describe, peer_ip
from gossiprouter.ops.admin import AdminServer
from gossiprouter.ops.auth import Authenticator, load_secret, load_tokens
from gossiprouter.ops.tls import ServerTLS, check_config
from gossiprouter.protocol import native as wire

if TYPE_CHECKING:
    from gossiprouter.server import Connection, Server

log = logging.getLogger("gossiprouter.ops")

# How long a refused native client gets to receive the ERROR saying why.
_FAREWELL_TIMEOUT = 0.5


@dataclass
class OpsStats:
    accepted: dict[str, int] = field(default_factory=dict)
    # (protocol or "any", reason) -> count
    refused: dict[tuple[str, str], int] = field(default_factory=dict)
    # (what, "ok" / "failed") -> count
    reloads: dict[tuple[str, str], int] = field(default_factory=dict)
    # Native connections whose HELLO was held back after failed authentications.
    auth_delayed: int = 0

    def bump(self, table: dict[tuple[str, str], int], key: tuple[str, str]) -> None:
        table[key] = table.get(key, 0) + 1


def check_startup(cfg: Config) -> None:
    """Load what the router would load at start-up (TLS files, tokens file) and check the
    options that depend on each other, raising ConfigError; nothing is kept."""
    check_config(cfg)
    if cfg.tls_cert:
        ServerTLS(cfg)
    if cfg.tokens_file:
        load_tokens(cfg.tokens_file)
    if cfg.admin_token:
        if not cfg.metrics:
            raise ConfigError("admin_token is set but metrics is not: the token protects "
                              "the metrics/admin endpoint, which is off")
        load_secret(cfg.admin_token)
    if cfg.metrics:
        host, port = parse_listen(cfg.metrics)
        if port and port == cfg.port and host in (cfg.host, "0.0.0.0", "::"):
            raise ConfigError(f"metrics = {cfg.metrics!r}: expected a port other than the "
                              f"router's ({cfg.port})")
        if port:
            # Try the port now, so a taken one is one clear line rather than an error
            # from inside the running server (the real bind follows within milliseconds).
            try:
                socket.create_server((host, port)).close()
            except OSError as e:
                raise ConfigError(f"metrics = {cfg.metrics!r}: cannot listen there "
                                  f"({e.strerror or e})") from None


class Operations:
    """TLS, access policy, authentication and the admin endpoint of one server."""

    def __init__(self, server: Server) -> None:
        cfg = server.config
        self.server = server
        self.stats = OpsStats()
        check_config(cfg)
        self.tls = ServerTLS(cfg) if cfg.tls_cert else None
        self.access = AccessPolicy.from_config(cfg)
        self.auth = (Authenticator(cfg.tokens_file, cfg.auth_backoff) if cfg.tokens_file
                     else None)
        server.hub.auth = self.auth
        self.admin: AdminServer | None = None
        if cfg.metrics:
            self.admin = AdminServer(server, cfg.metrics, self._metrics_renderer(),
                                     cfg.admin_token)

    def _metrics_renderer(self) -> Callable[[], Awaitable[bytes]] | None:
        try:
            from gossiprouter.ops.metrics import Metrics
        except ImportError:
            log.warning("prometheus-client is not installed: /metrics answers 503 "
                        "(pip install 'gossiprouter[ops]')")
            return None
        return Metrics(self.server, self).render

    @property
    def admin_address(self) -> tuple[str, int] | None:
        return None if self.admin is None else self.admin.address

    # ------------------------------------------------------------------ server hooks

    async def serve(self, *, task_status: trio.TaskStatus[tuple[str, int] | None] =
                    trio.TASK_STATUS_IGNORED) -> None:
        """Run the admin endpoint until cancelled; started() with its address (None: off)."""
        if self.admin is None:
            task_status.started(None)
            return
        await self.admin.serve(task_status=task_status)

    async def accept(self, conn: Connection) -> bool:
        """A new connection: refuse a peer no protocol admits, then TLS. False: close it."""
        access = self.access
        if not access.everyone and not access.admits_any(peer_ip(conn.peer)):
            self.stats.bump(self.stats.refused, ("any", "network"))
            log.warning("refusing %s: its network may not use any protocol here", conn.peer,
                        extra={"peer": conn.peer, "reason": "network"})
            return False
        if self.tls is not None:
            tls = await self.tls.handshake(conn.stream, conn.peer)
            if tls is None:
                return False
            conn.stream = tls
        return True

    async def admit(self, conn: Connection, protocol: str) -> bool:
        """The connection's protocol is known: may its peer speak it? False: close it."""
        access = self.access
        reason = None if access.everyone else access.verdict(protocol, peer_ip(conn.peer))
        if reason is None:
            self.stats.accepted[protocol] = self.stats.accepted.get(protocol, 0) + 1
            if protocol == "native" and self.auth is not None:
                # Recent failed authentications from this address: its HELLO waits its turn
                # (bounded by the handshake deadline, which the server applies around this).
                delay = self.auth.backoff.delay(conn.peer.rpartition(":")[0], time.monotonic())
                if delay > 0:
                    self.stats.auth_delayed += 1
                    await trio.sleep(delay)
            return True
        self.stats.bump(self.stats.refused, (protocol, reason))
        if reason == "disabled":
            why = "JGroups protocols are disabled (jgroups = false)"
        else:
            why = (f"{protocol} is allowed only from "
                   f"{describe(access.lists[protocol].networks)}")
        log.warning("refusing %s (%s): %s", conn.peer, protocol, why,
                    extra={"peer": conn.peer, "protocol": protocol, "reason": reason})
        if protocol == "native":
            # Native clients can be told why; JGroups ones have no error frame.
            with (trio.move_on_after(_FAREWELL_TIMEOUT),
                  contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError)):
                await conn.stream.send_all(wire.encode_error(None, "unauthorized", why))
        return False

    # ------------------------------------------------------------------ SIGHUP

    def reload(self) -> None:
        """Reload TLS certificates and the tokens file; on any error keep the old ones.

        Open connections are untouched: TLS ones keep the context they were
        accepted with, authenticated ones their identity.
        """
        if self.tls is not None:
            try:
                self.tls.reload()
            except ConfigError as e:
                self.stats.bump(self.stats.reloads, ("tls", "failed"))
                log.error("TLS reload failed, keeping the current certificate: %s", e)
            else:
                self.stats.bump(self.stats.reloads, ("tls", "ok"))
                log.info("reloaded TLS certificate %s; new connections use it", self.tls.cert)
        if self.auth is not None:
            try:
                self.auth.reload()
            except ConfigError as e:
                self.stats.bump(self.stats.reloads, ("tokens", "failed"))
                log.error("tokens reload failed, keeping the current tokens: %s", e)
            else:
                self.stats.bump(self.stats.reloads, ("tokens", "ok"))
                log.info("reloaded tokens_file %s: %d identities", self.auth.path,
                         self.auth.tokens.identities)
        if self.admin is not None and self.admin.token_ref:
            try:
                self.admin.reload()
            except ConfigError as e:
                self.stats.bump(self.stats.reloads, ("admin_token", "failed"))
                log.error("admin_token reload failed, keeping the current token: %s", e)
            else:
                self.stats.bump(self.stats.reloads, ("admin_token", "ok"))
                log.info("reloaded admin_token")
        if self.tls is None and self.auth is None and not (
                self.admin is not None and self.admin.token_ref):
            log.info("SIGHUP: nothing to reload (no TLS, no tokens_file, no admin_token)")


async def reload_on_sighup(server: Server) -> None:
    """Reload TLS certificates and tokens on every SIGHUP, until cancelled (CLI only:
    a library must not take over the process's signals)."""
    if not hasattr(signal, "SIGHUP"):  # pragma: no cover - Windows
        return
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            log.info("received SIGHUP: reloading")
            server.ops.reload()
