"""Fixtures for the JGroups interop tests: compiled Java programs, the router under test, nodes.

``INTEROP_ROUTER`` picks the router: ``gossiprouter`` (default; ``python -m gossiprouter serve``)
or ``java212`` (the real JGroups 2.12 GossipRouter). Tests marked ``gossiprouter_only`` are
deselected when the router is not gossiprouter.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import (
    ROUTER_GOSSIPROUTER,
    NodeFactory,
    Router,
    ensure_compiled,
    free_port,
    router_kind,
)

GOSSIPROUTER_ONLY = "gossiprouter_only"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{GOSSIPROUTER_ONLY}: needs this project's router (deselected unless "
        "INTEROP_ROUTER=gossiprouter)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if router_kind() == ROUTER_GOSSIPROUTER:
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        is_interop = item.path.parent == Path(__file__).parent
        if is_interop and item.get_closest_marker(GOSSIPROUTER_ONLY) is not None:
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def java_classes() -> Path:
    """Compile tests/interop/java/*.java when stale; fails (never skips) without a JDK/jar."""
    return ensure_compiled()


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    """The router under test, listening on a free 127.0.0.1 port; stopped after the test."""
    r = Router(router_kind(), free_port(), tmp_path)
    r.start()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def nodes(java_classes: Path, router: Router, tmp_path: Path) -> Iterator[NodeFactory]:
    factory = NodeFactory(router, tmp_path)
    try:
        yield factory
    finally:
        factory.close()
