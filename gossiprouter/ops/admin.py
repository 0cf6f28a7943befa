"""The read-only HTTP endpoint: Prometheus ``/metrics`` and the admin view ``/groups``.

A deliberately small HTTP/1.1 server on trio, running in the router's own
process and event loop, so a scrape sees the live table without locks or
threads. One request per connection (``Connection: close``), GET or HEAD
only, bounded request size, time and concurrency: it must never be a way to
hurt the router. Endpoints:

* ``/metrics``: Prometheus text format (see :mod:`gossiprouter.ops.metrics`).
* ``/groups?limit=N&after=NAME``: groups by name with their member and watcher counts,
  one page at a time (``next`` is the ``after`` of the next page, null on the last).
* ``/groups/NAME?limit=N&offset=K`` (NAME percent-encoded): the members of one group, a page.

Anything else is a 404 with a JSON body; other methods get 405. With ``admin_token`` set,
every request needs ``Authorization: Bearer TOKEN`` (else 401).

The endpoint shares the routing loop, so no view may hold it for more than a few
milliseconds: every answer is bounded (pages of at most MAX_LIMIT items) and the walks over
the table behind it (:mod:`server.snapshot`) yield to the loop every few thousand items.
What it shows comes from those snapshots and the server's :class:`~gossiprouter.server.snapshot.
RouterView`, never from the server's own objects; this module only turns them into JSON.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import trio

from gossiprouter.core.addresses import format_hostport
from gossiprouter.core.cli_errors import needs_extra
from gossiprouter.core.config import ConfigError
from gossiprouter.core.options import parse_listen
from gossiprouter.ops.auth import load_secret
from gossiprouter.routing.table import RoutingTable
from gossiprouter.server import snapshot

if TYPE_CHECKING:
    from gossiprouter.federation.bridge import Bridge
    from gossiprouter.server.snapshot import MemberInfo, RouterView

log = logging.getLogger("gossiprouter.ops.admin")

MAX_REQUEST = 16 * 1024
REQUEST_TIMEOUT = 10.0
# Requests answered at once (a request holds a slot only once its head is read).
MAX_CLIENTS = 32
# Connections still sending their request head: each has HEAD_TIMEOUT to send it, and past
# MAX_UNREAD of them the oldest is closed for the newest, so idle connections without a
# token (or a request) can never lock the scraper out (issue 31).
HEAD_TIMEOUT = 5.0
MAX_UNREAD = 32

# Pages: items per answer by default and at most.
DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed",
            413: "Content Too Large", 500: "Internal Server Error",
            503: "Service Unavailable"}

Response = tuple[int, str, bytes]

# The Content-Type of /metrics: the exposition format every Prometheus version reads (our
# names need no escaping), which gossiprouter.ops.metrics renders.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


# ---------------------------------------------------------------------- views (pure)


async def groups_view(table: RoutingTable, after: str = "",
                      limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """``/groups``: the first ``limit`` groups whose name sorts after ``after``, with their
    member and watcher counts; ``next`` is the cursor of the following page (None: last).
    Never holds the loop for long (:func:`gossiprouter.server.snapshot.group_page`)."""
    page = await snapshot.group_page(table, after, limit)
    return {"groups": [{"name": g.name, "members": g.members, "watchers": g.watchers}
                       for g in page.groups],
            "total": page.total, "next": page.next}


def bridge_view(bridge: Bridge | None) -> dict[str, Any]:
    """The federation bridge's state in ``/groups`` (no key without a bridge)."""
    return {} if bridge is None else {"bridge": bridge.view()}


async def group_view(table: RoutingTable, name: str, now: float, offset: int = 0,
                     limit: int = DEFAULT_LIMIT) -> dict[str, Any] | None:
    """``/groups/NAME``: members ``offset`` to ``offset + limit`` in registration order, or
    None for an unknown group; ``next_offset`` is None on the last page."""
    page = await snapshot.member_page(table, name, now, offset, limit)
    if page is None:
        return None
    return {"name": page.name, "watchers": page.watchers, "total": page.total,
            "offset": page.offset, "members": [member_view(m) for m in page.members],
            "next_offset": page.next_offset}


def member_view(m: MemberInfo) -> dict[str, Any]:
    return {
        "addr": m.addr.hex(),
        "name": m.name,
        "physical": [format_hostport(h, p) for h, p in m.physical],
        "kind": m.kind,
        "sticky": m.sticky,
        "identity": m.identity,
        # Registration order; "active" marks the one that carries the traffic now.
        "connections": [{"peer": c.peer, "protocol": c.protocol, "active": c.active}
                        for c in m.connections],
        "expires_in": None if m.expires_in is None else round(m.expires_in, 3),
        "grace_remaining": None if m.grace_remaining is None else round(m.grace_remaining, 3),
        "held_bytes": m.held_bytes,
    }


def _json(status: int, obj: Any) -> Response:
    return status, "application/json", (json.dumps(obj, indent=2) + "\n").encode()


# ---------------------------------------------------------------------- the server


class AdminServer:
    """Serves the endpoints for one router on ``listen`` = HOST:PORT (the ``metrics``
    option), from the router's view it is given in :meth:`serve`."""

    def __init__(self, listen: str, token: str = "") -> None:
        # admin_token: file:PATH or env:NAME (ConfigError when it cannot be read).
        self.token_ref = token
        self.token = load_secret(token) if token else ""
        self.unauthorized = 0
        self.host, self.port = parse_listen(listen)
        self.listen = listen
        # Set by serve: what the endpoints show.
        self.view: RouterView | None = None
        self.render_metrics: Callable[[], Awaitable[bytes]] | None = None
        self.address: tuple[str, int] | None = None
        self._limit = trio.Semaphore(MAX_CLIENTS)
        # The head reads under way, oldest first: the scope that ends each one.
        self._unread: dict[trio.CancelScope, None] = {}
        self.evicted = 0  # connections closed for a newer one before sending their head

    async def serve(self, view: RouterView,
                    render_metrics: Callable[[], Awaitable[bytes]] | None, *,
                    task_status: trio.TaskStatus[tuple[str, int]] =
                    trio.TASK_STATUS_IGNORED) -> None:
        """Serve ``view`` (and ``render_metrics`` on /metrics; None: 503) until cancelled."""
        self.view, self.render_metrics = view, render_metrics
        try:
            listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        except OSError as e:
            raise ConfigError(f"metrics = {self.listen!r}: cannot listen there "
                              f"({e.strerror or e})") from None
        name = listeners[0].socket.getsockname()
        self.address = (name[0], name[1])
        log.info("metrics and admin view on http://%s:%d/ (/metrics, /groups)",
                 *self.address)
        try:
            async with trio.open_nursery() as nursery:
                for listener in listeners:
                    nursery.start_soon(self._accept, listener, nursery)
                task_status.started(self.address)
        finally:
            for listener in listeners:
                with trio.CancelScope(shield=True):
                    await listener.aclose()

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as e:  # out of fds and the like: the router matters more
                log.warning("admin accept failed: %s", e)
                await trio.sleep(0.5)
                continue
            nursery.start_soon(self._handle, stream)

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(REQUEST_TIMEOUT):
                head = await self._read_head(stream)
                if head is not None:
                    await self._answer(stream, head)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        except Exception:  # a bug in a view must not take the router down
            log.exception("admin request failed")
        finally:
            await trio.aclose_forcefully(stream)

    async def _read_head(self, stream: trio.SocketStream) -> bytes | None:
        """The request head, or None: the peer closed, sent no head within HEAD_TIMEOUT,
        was closed for a newer connection (past MAX_UNREAD), or sent no HTTP (answered)."""
        scope = trio.CancelScope(deadline=trio.current_time() + HEAD_TIMEOUT)
        self._unread[scope] = None
        if len(self._unread) > MAX_UNREAD:
            oldest = next(iter(self._unread))
            del self._unread[oldest]
            oldest.cancel()
            self.evicted += 1
        try:
            with scope:
                head = b""
                while b"\r\n\r\n" not in head and b"\n\n" not in head:
                    if len(head) > MAX_REQUEST:
                        await _send(stream, "GET", _json(413, {"error": "request too large"}))
                        return None
                    data = await stream.receive_some(4096)
                    if not data:
                        return None
                    head += data
                    if not _http_line(head):
                        # A client of another protocol (a RouterStub sent here by mistake)
                        # is told at once, not when the head times out.
                        await _send(stream, "GET", _json(400, {"error": "not HTTP"}))
                        return None
                return head
            return None
        finally:
            self._unread.pop(scope, None)

    async def _answer(self, stream: trio.SocketStream, head: bytes) -> None:
        line = head.split(b"\n", 1)[0].decode("latin-1").strip()
        parts = line.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            await _send(stream, "GET", _json(400, {"error": "not an HTTP request line"}))
            return
        method, target = parts[0], parts[1]
        if self.token and not self._authorized(head):
            self.unauthorized += 1
            await _send(stream, method, _json(401, {
                "error": "this endpoint needs Authorization: Bearer TOKEN (admin_token)"}),
                extra='WWW-Authenticate: Bearer realm="gossiprouter"\r\n')
            return
        if self._limit.value == 0:  # too many requests at once: refuse, never queue
            await _send(stream, method, _json(503, {"error": "too many requests at once"}))
            return
        async with self._limit:
            await self._respond_to(stream, method, target)

    async def _respond_to(self, stream: trio.SocketStream, method: str, target: str) -> None:
        if method not in ("GET", "HEAD"):
            await _send(stream, method, _json(405, {
                "error": f"{method} not allowed: this endpoint is read-only (GET, HEAD)"}),
                extra="Allow: GET, HEAD\r\n")
            return
        try:
            url = urlsplit(target)
            response = await self.respond(url.path, url.query)
        except Exception:
            log.exception("admin view %s failed", target)
            response = _json(500, {"error": "internal error; see the router's log"})
        await _send(stream, method, response)

    def _authorized(self, head: bytes) -> bool:
        for line in head.split(b"\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"authorization":
                scheme, _, cred = value.strip().partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(
                    cred.strip(), self.token.encode())
        return False

    def reload(self) -> None:
        """SIGHUP: read admin_token again (ConfigError: the old one stays)."""
        if self.token_ref:
            self.token = load_secret(self.token_ref)

    async def respond(self, path: str, query: str = "") -> Response:
        """The response to GET ``path`` (raw, percent-encoded) with ``query``."""
        view = self.view
        assert view is not None, "requests arrive only once serve() has started"
        table = view.hub.table
        if path == "/metrics":
            if self.render_metrics is None:
                return _json(503, {"error": needs_extra("metrics", "prometheus-client",
                                                        "metrics")})
            return 200, CONTENT_TYPE, await self.render_metrics()
        try:
            q = {k: v[-1] for k, v in parse_qs(query, strict_parsing=False).items()}
            limit = int(q.get("limit", DEFAULT_LIMIT))
            offset = int(q.get("offset", 0))
        except ValueError:
            return _json(400, {"error": "limit and offset must be integers"})
        if not 1 <= limit <= MAX_LIMIT or offset < 0:
            return _json(400, {"error": f"expected 1 <= limit <= {MAX_LIMIT} and offset >= 0"})
        if path in ("/groups", "/groups/"):
            return _json(200, await groups_view(table, q.get("after", ""), limit)
                         | bridge_view(view.bridge))
        if path.startswith("/groups/"):
            try:
                name = unquote(path[len("/groups/"):], errors="strict")
            except UnicodeDecodeError:
                return _json(400, {"error": "group name is not percent-encoded UTF-8"})
            page = await group_view(table, name, trio.current_time(), offset, limit)
            if page is None:
                return _json(404, {"error": f"no group {name!r}"})
            return _json(200, page)
        return _json(404, {"error": f"no such endpoint {path!r}",
                           "endpoints": ["/metrics", "/groups", "/groups/NAME"]})


def _http_line(head: bytes) -> bool:
    """Whether the request line received so far can be HTTP: no control bytes but CR, TAB."""
    line = head.split(b"\n", 1)[0]
    return not any((c < 32 and c not in (9, 13)) or c == 127 for c in line)


async def _send(stream: trio.SocketStream, method: str, response: Response,
                extra: str = "") -> None:
    status, ctype, body = response
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n"
            f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            f"Cache-Control: no-store\r\nConnection: close\r\n{extra}\r\n").encode()
    await stream.send_all(head if method == "HEAD" else head + body)
