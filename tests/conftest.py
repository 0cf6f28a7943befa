"""Shared fixtures: an in-process router on a free 127.0.0.1 port, and a raw native client."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio

from gossiprouter.config import Config
from gossiprouter.server import Server

RouterFactory = Callable[..., Awaitable[Server]]


@pytest.fixture
async def start_router(nursery: trio.Nursery) -> RouterFactory:
    """Start a router with the given Config overrides; returns the Server (``.address`` set)."""

    async def start(**overrides: object) -> Server:
        cfg = Config(host="127.0.0.1", port=0, **overrides)  # type: ignore[arg-type]
        server = Server(cfg)
        await nursery.start(server.serve)
        return server

    return start


@pytest.fixture
async def router(start_router: RouterFactory) -> Server:
    return await start_router()
