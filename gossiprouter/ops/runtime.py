"""The operations layer's side of the server: :class:`Operations`, the router's hooks.

:class:`Operations` is built from a Config and handed to the server
(``Server(config, hooks=Operations(config))``, as ``gossiprouter serve`` and
:class:`~gossiprouter.router.Router` do); it implements
:class:`gossiprouter.server.hooks.ServerHooks`, and that Protocol is all the server knows of it.
The server calls:

* :meth:`Operations.serve` in its nursery, with a read-only
  :class:`~gossiprouter.server.snapshot.RouterView` (the metrics/admin HTTP port reads it);
* :meth:`Operations.accept` once per accepted connection, before the first
  byte is read: the allow-list check on the peer IP, then the TLS handshake
  (it returns the TLS stream, so protocol sniffing happens on the decrypted bytes);
* :meth:`Operations.admit` once per connection when its protocol is known;
* :meth:`Operations.refused` when the server closed a connection at accept (limits).

Nothing here runs per frame. :func:`check_startup` lets the CLI refuse bad
TLS files or tokens before it starts listening; :func:`reload_on_sighup`
is the CLI's SIGHUP handler.
"""

from __future__ import annotations

import logging
import signal
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from gossiprouter.core.cli_errors import install_hint
from gossiprouter.core.config import Config, ConfigError
from gossiprouter.core.options import parse_listen
from gossiprouter.ops.access import AccessPolicy, describe, peer_host, peer_ip
from gossiprouter.ops.admin import AdminServer
from gossiprouter.ops.auth import Authenticator, load_secret, load_tokens
from gossiprouter.ops.stats import OpsStats
from gossiprouter.ops.tls import ServerTLS, check_config
from gossiprouter.server.hooks import ByteStream

if TYPE_CHECKING:
    from gossiprouter.ops.metrics import Metrics
    from gossiprouter.server.snapshot import RouterView

log = logging.getLogger("gossiprouter.ops")


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
    """TLS, access policy, authentication and the admin endpoint of one server: its hooks
    (:class:`gossiprouter.server.hooks.ServerHooks`). Raises ConfigError for bad files."""

    def __init__(self, config: Config) -> None:
        cfg = config
        self.config = config
        self.stats = OpsStats()
        check_config(cfg)
        self.tls = ServerTLS(cfg) if cfg.tls_cert else None
        self.access = AccessPolicy.from_config(cfg)
        # The server hands it to the native sessions (Hub.auth).
        self.auth = (Authenticator(cfg.tokens_file, cfg.auth_backoff) if cfg.tokens_file
                     else None)
        self.admin: AdminServer | None = None
        self._metrics: type[Metrics] | None = None
        if cfg.metrics:
            self.admin = AdminServer(cfg.metrics, cfg.admin_token)
            self._metrics = _metrics_class()

    @property
    def admin_address(self) -> tuple[str, int] | None:
        return None if self.admin is None else self.admin.address

    # ------------------------------------------------------------------ server hooks

    async def serve(self, view: RouterView, *, task_status: trio.TaskStatus[
            tuple[str, int] | None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the admin endpoint over ``view`` until cancelled; started() with its address
        (None: off)."""
        if self.admin is None:
            task_status.started(None)
            return
        render = None if self._metrics is None else self._metrics(view, self).render
        await self.admin.serve(view, render, task_status=task_status)

    async def accept(self, stream: trio.SocketStream, peer: str) -> ByteStream | None:
        """A new connection: refuse a peer no protocol admits (None), then TLS (the stream
        to read, or None when the handshake failed)."""
        access = self.access
        if not access.everyone and not access.admits_any(peer_ip(peer)):
            self.refused(peer, "network")
            log.warning("refusing %s: its network may not use any protocol here", peer,
                        extra={"peer": peer, "reason": "network"})
            return None
        if self.tls is not None:
            return await self.tls.handshake(stream, peer)
        return stream

    async def admit(self, peer: str, protocol: str) -> str | None:
        """The connection's protocol is known: may its peer speak it? None: yes; else why
        not (the server tells a native client so, and closes)."""
        access = self.access
        reason = None if access.everyone else access.verdict(protocol, peer_ip(peer))
        if reason is None:
            self.stats.accepted[protocol] = self.stats.accepted.get(protocol, 0) + 1
            if protocol == "native" and self.auth is not None:
                # Recent failed authentications from this address: its HELLO waits its turn
                # (bounded by the handshake deadline, which the server applies around this).
                delay = self.auth.backoff.delay(peer_host(peer), time.monotonic())
                if delay > 0:
                    self.stats.auth_delayed += 1
                    await trio.sleep(delay)
            return None
        self.stats.bump(self.stats.refused, (protocol, reason))
        if reason == "disabled":
            why = "JGroups protocols are disabled (jgroups = false)"
        else:
            why = (f"{protocol} is allowed only from "
                   f"{describe(access.lists[protocol].networks)}")
        log.warning("refusing %s (%s): %s", peer, protocol, why,
                    extra={"peer": peer, "protocol": protocol, "reason": reason})
        return why

    def refused(self, peer: str, reason: str) -> None:
        """Count a connection closed at accept (metric connections_refused, protocol any)."""
        self.stats.bump(self.stats.refused, ("any", reason))

    # ------------------------------------------------------------------ SIGHUP

    def reload(self) -> None:
        """Reload TLS certificates and the tokens file; on any error keep the old ones.

        Open connections are untouched: TLS ones keep the context they were
        accepted with, authenticated ones their identity.
        """
        tls, auth, admin = self.tls, self.auth, self.admin
        if tls is not None:
            self._reload("tls", tls.reload,
                         "TLS reload failed, keeping the current certificate",
                         lambda: f"reloaded TLS certificate {tls.cert}; new connections use it")
        if auth is not None:
            self._reload("tokens", auth.reload,
                         "tokens reload failed, keeping the current tokens",
                         lambda: f"reloaded tokens_file {auth.path}: "
                                 f"{auth.tokens.identities} identities")
        if admin is not None and admin.token_ref:
            self._reload("admin_token", admin.reload,
                         "admin_token reload failed, keeping the current token",
                         lambda: "reloaded admin_token")
        if tls is None and auth is None and not (admin is not None and admin.token_ref):
            log.info("SIGHUP: nothing to reload (no TLS, no tokens_file, no admin_token)")

    def _reload(self, what: str, reload: Callable[[], None], failed: str,
                done: Callable[[], str]) -> None:
        """One reload: counted (metric reloads{what, result}) and logged either way."""
        try:
            reload()
        except ConfigError as e:
            self.stats.bump(self.stats.reloads, (what, "failed"))
            log.error("%s: %s", failed, e)
        else:
            self.stats.bump(self.stats.reloads, (what, "ok"))
            log.info("%s", done())


def _metrics_class() -> type[Metrics] | None:
    """The metrics renderer, or None (logged) when prometheus-client is not installed."""
    try:
        from gossiprouter.ops.metrics import Metrics
    except ImportError:
        log.warning("prometheus-client is not installed: /metrics answers 503 (%s)",
                    install_hint("metrics"))
        return None
    return Metrics


async def reload_on_sighup(ops: Operations) -> None:
    """Reload TLS certificates and tokens on every SIGHUP, until cancelled (CLI only:
    a library must not take over the process's signals)."""
    if not hasattr(signal, "SIGHUP"):  # pragma: no cover - Windows
        return
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            log.info("received SIGHUP: reloading")
            ops.reload()
