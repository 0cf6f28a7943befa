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
the table behind it yield to the loop every BATCH items.
"""

from __future__ import annotations

import heapq
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import trio

from gossiprouter.config import ConfigError, parse_listen
from gossiprouter.ops.auth import load_secret
from gossiprouter.routing import Entry, RoutingTable

if TYPE_CHECKING:
    from gossiprouter.server import Server

log = logging.getLogger("gossiprouter.ops.admin")

MAX_REQUEST = 16 * 1024
REQUEST_TIMEOUT = 10.0
MAX_CLIENTS = 32

# Pages: items per answer by default and at most; items examined between two checkpoints.
DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000
BATCH = 2000

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed",
            413: "Content Too Large", 500: "Internal Server Error",
            503: "Service Unavailable"}

Response = tuple[int, str, bytes]


# ---------------------------------------------------------------------- views (pure)


async def groups_view(table: RoutingTable, after: str = "",
                      limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """``/groups``: the first ``limit`` groups whose name sorts after ``after``, with their
    member and watcher counts; ``next`` is the cursor of the following page (None: last).

    The names are copied (at C speed) and scanned BATCH at a time, keeping the ``limit``
    smallest, with a checkpoint between batches: the loop is never held for long, whatever
    the number of groups. Groups created or removed meanwhile may or may not be listed.
    """
    names = list(table.groups)
    best: list[str] = []
    beyond = 0  # names after the cursor: is there a next page?
    for i in range(0, len(names), BATCH):
        fresh = [n for n in names[i : i + BATCH] if n > after]
        beyond += len(fresh)
        if fresh:
            best = heapq.nsmallest(limit, best + fresh)
        await trio.lowlevel.checkpoint()
    out = []
    for n in best:
        g = table.groups.get(n)
        if g is not None:
            out.append({"name": n, "members": len(g.entries), "watchers": len(g.watchers)})
    return {"groups": out, "total": len(names),
            "next": best[-1] if beyond > limit and best else None}


def bridge_view(server: Server) -> dict[str, Any]:
    """The federation bridge's state in ``/groups`` (no key without a bridge)."""
    bridge = server.bridge
    return {} if bridge is None else {"bridge": bridge.view()}


async def group_view(table: RoutingTable, name: str, now: float, offset: int = 0,
                     limit: int = DEFAULT_LIMIT) -> dict[str, Any] | None:
    """``/groups/NAME``: members ``offset`` to ``offset + limit`` in registration order, or
    None for an unknown group; ``next_offset`` is None on the last page."""
    g = table.group(name)
    if g is None:
        return None
    entries = list(g.entries.values())[offset : offset + limit]
    total = len(g.entries)
    members = []
    for i in range(0, len(entries), BATCH):
        members += [member_view(e, now) for e in entries[i : i + BATCH]]
        await trio.lowlevel.checkpoint()
    end = offset + len(entries)
    return {"name": g.name, "watchers": len(g.watchers), "total": total, "offset": offset,
            "members": members, "next_offset": end if end < total else None}


def member_view(e: Entry, now: float) -> dict[str, Any]:
    active = e.carrier
    return {
        "addr": e.addr.hex(),
        "name": e.name,
        "physical": [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in e.physical],
        "kind": e.kind.label,
        "sticky": e.sticky,
        "identity": e.identity,
        # Registration order; "active" marks the one that carries the traffic now.
        "connections": [
            {"peer": c.peer, "protocol": c.protocol, "active": c is active}
            for c in e.carriers
        ],
        "expires_in": None if e.expires_at is None else round(max(e.expires_at - now, 0), 3),
        "grace_remaining": (None if e.grace_until is None
                            else round(max(e.grace_until - now, 0), 3)),
        "held_bytes": e.held_bytes,
    }


def _json(status: int, obj: Any) -> Response:
    return status, "application/json", (json.dumps(obj, indent=2) + "\n").encode()


# ---------------------------------------------------------------------- the server


class AdminServer:
    """Serves the endpoints for one router (``server``) on ``metrics`` = HOST:PORT."""

    def __init__(self, server: Server, listen: str,
                 render_metrics: Callable[[], Awaitable[bytes]] | None,
                 token: str = "") -> None:
        self.server = server
        # admin_token: file:PATH or env:NAME (ConfigError when it cannot be read).
        self.token_ref = token
        self.token = load_secret(token) if token else ""
        self.unauthorized = 0
        self.host, self.port = parse_listen(listen)
        self.listen = listen
        self.render_metrics = render_metrics
        self.address: tuple[str, int] | None = None
        self._limit = trio.Semaphore(MAX_CLIENTS)

    async def serve(self, *, task_status: trio.TaskStatus[tuple[str, int]] =
                    trio.TASK_STATUS_IGNORED) -> None:
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
        if self._limit.value == 0:  # too many scrapers at once: refuse, never queue
            await trio.aclose_forcefully(stream)
            return
        async with self._limit:
            try:
                with trio.move_on_after(REQUEST_TIMEOUT):
                    await self._exchange(stream)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
            except Exception:  # a bug in a view must not take the router down
                log.exception("admin request failed")
            finally:
                await trio.aclose_forcefully(stream)

    async def _exchange(self, stream: trio.SocketStream) -> None:
        head = b""
        while b"\r\n\r\n" not in head and b"\n\n" not in head:
            if len(head) > MAX_REQUEST:
                await _send(stream, "GET", _json(413, {"error": "request too large"}))
                return
            data = await stream.receive_some(4096)
            if not data:
                return
            head += data
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
        table = self.server.hub.table
        if path == "/metrics":
            if self.render_metrics is None:
                return _json(503, {"error": "metrics need prometheus-client: pip install "
                                            "'gossiprouter[ops]'"})
            from gossiprouter.ops.metrics import CONTENT_TYPE

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
                         | bridge_view(self.server))
        if path.startswith("/groups/"):
            try:
                name = unquote(path[len("/groups/"):], errors="strict")
            except UnicodeDecodeError:
                return _json(400, {"error": "group name is not percent-encoded UTF-8"})
            view = await group_view(table, name, trio.current_time(), offset, limit)
            if view is None:
                return _json(404, {"error": f"no group {name!r}"})
            return _json(200, view)
        return _json(404, {"error": f"no such endpoint {path!r}",
                           "endpoints": ["/metrics", "/groups", "/groups/NAME"]})


async def _send(stream: trio.SocketStream, method: str, response: Response,
                extra: str = "") -> None:
    status, ctype, body = response
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n"
            f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            f"Cache-Control: no-store\r\nConnection: close\r\n{extra}\r\n").encode()
    await stream.send_all(head if method == "HEAD" else head + body)
