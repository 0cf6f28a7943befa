"""The dependency rules of docs/architecture.md, read from the imports (ast, no importing).

Every module of ``gossiprouter`` belongs to one layer (:data:`LAYERS`); a layer may import
only the layers :data:`ALLOWED` names. The imports that break a rule today are listed in
:data:`KNOWN_VIOLATIONS`, each with the issue item that removes it: any other forbidden import
fails, and so does an entry that no longer occurs (take it out of the list, and out of
docs/architecture.md, when its item is done). Every import counts, ``TYPE_CHECKING`` ones and
those inside functions included: a dependency for the type checker is still one for the reader.

One rule is about attributes, not imports: the operations layer reads the core through the hub
and :mod:`server.snapshot`, so an ``ops`` module touches no ``obj._private`` attribute of
anything but itself (:func:`private_attributes`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Module (or package prefix) -> layer. The longest match wins; a module that matches nothing
# fails test_every_module_has_a_layer (say where it belongs here and in docs/architecture.md).
LAYERS: dict[str, str] = {
    # The loose files at the top: the public front and what stands beside it.
    "gossiprouter": "package",  # the public front: re-exports the client and __version__
    "gossiprouter._version": "core",  # __version__, for the package and the metrics
    "gossiprouter.__main__": "cli",
    "gossiprouter.stub": "client",  # deprecated import path of the client's public names
    # The in-process Router API: a whole router (server + ops hooks), built from one config.
    "gossiprouter.router": "embedding",
    # Every folder is one layer (docs/architecture.md, "Layout").
    "gossiprouter.protocol": "protocol",
    "gossiprouter.core": "core",  # addresses, topics, options, the error style: pure data
    "gossiprouter.routing": "routing",
    "gossiprouter.sessions": "sessions",
    "gossiprouter.federation": "federation",
    "gossiprouter.server": "server",
    "gossiprouter.ops": "ops",
    "gossiprouter.client": "client",
    "gossiprouter.cli": "cli",
    "gossiprouter.loadtest": "loadtest",
    "gossiprouter.analytics": "analytics",
}

_CORE = {"protocol", "core", "routing", "sessions"}
ALLOWED: dict[str, set[str]] = {
    # Bytes in, events out: nothing of the router, nothing of I/O.
    "protocol": {"protocol"},
    # Addresses, topics, the options and the error style: plain data over the protocol.
    "core": {"protocol", "core"},
    # Membership decisions over plain data: no sessions, no server, no I/O.
    "routing": {"protocol", "core", "routing"},
    # Routing decisions for one connection's bytes: no server, no I/O.
    "sessions": {"protocol", "core", "routing", "sessions"},
    # Groups that span routers: sans-IO state over the table (federation.state and its
    # codecs, NO_IO_MODULES) and the MQTT bridge that carries it, beside the server.
    "federation": _CORE | {"federation"},
    # The I/O: sockets, tasks, outboxes written out.
    "server": _CORE | {"federation", "server"},
    # Operations depend on the core, one way (the core does not import ops).
    "ops": _CORE | {"federation", "server", "ops"},
    # The embedding API wires a server and its ops hooks together, as the CLI does.
    "embedding": _CORE | {"federation", "server", "ops", "embedding"},
    # The client speaks the protocol; it knows nothing of the server's insides or settings
    # (FORBIDDEN_MODULES: not the router's options either).
    "client": {"protocol", "core", "client"},
    "package": {"client", "core"},
    "loadtest": {"protocol", "core", "client", "package", "loadtest"},
    "analytics": {"core", "loadtest", "analytics"},
    "cli": set(LAYERS.values()),
}

# Modules a layer may not import although their layer is allowed: layer -> {module: why}.
FORBIDDEN_MODULES: dict[str, dict[str, str]] = {
    "client": {"gossiprouter.core.config": "the client knows nothing of the router's settings"},
    "package": {"gossiprouter.core.config": "the client knows nothing of the router's settings"},
}

# Layers that must stay sans-IO: no event loop, no sockets.
NO_IO = {"protocol", "core", "routing", "sessions"}
IO_MODULES = {"trio", "anyio", "socket", "ssl", "selectors", "asyncio"}
# Client modules that must stay sans-IO too (issue 14 item 3): the data, and the pure
# registrar, merge and local delivery that are tested without sockets.
NO_IO_MODULES = {"gossiprouter.federation.state", "gossiprouter.federation.codec",
                 "gossiprouter.federation.moves",
                 "gossiprouter.federation.remote", "gossiprouter.federation.grace",
                 "gossiprouter.federation.liveness", "gossiprouter.federation.frames",
                 "gossiprouter.federation.signing", "gossiprouter.federation.mqtt_topics",
                 "gossiprouter.federation.batch",
                 "gossiprouter.client.status", "gossiprouter.client.errors",
                 "gossiprouter.client.model", "gossiprouter.client.registrar",
                 "gossiprouter.client.merge", "gossiprouter.client.local"}

# The client runs on asyncio and trio through AnyIO (issue 23): its package imports no trio,
# so an asyncio application never loads it. (importer, why) for the exceptions.
CLIENT_TRIO_ALLOWED: dict[str, str] = {
    "gossiprouter.client.tls": "wrap_client, for callers' own trio streams: imports trio when "
                               "called (and for its annotations)",
    "gossiprouter.client.blocking": "the blocking facade runs the stub in its own trio loop on "
                                    "a thread; the package front loads it on first use only",
    "gossiprouter.client.cli": "`gossiprouter send | listen | members | publish`: commands run "
                               "by trio.run from the CLI, never imported by the client itself",
}

# (importer, imported) -> why it is there and which issue item removes it.
KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {}

# Attributes with a leading underscore that an ops module may touch on something other than
# self/cls, (module, attribute) -> why it is not the core's.
PRIVATE_ALLOWED: dict[tuple[str, str], str] = {}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str, root: Path) -> bool:
    base = root.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports(path: Path, root: Path = ROOT) -> tuple[set[str], set[str]]:
    """What the file at ``path`` imports: (modules of gossiprouter, other top-level modules).

    ``from gossiprouter.protocol import native`` imports ``gossiprouter.protocol.native``;
    ``from gossiprouter import __version__`` imports the package ``gossiprouter``.
    """
    me = module_name(path, root)
    ours: set[str] = set()
    others: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                if top == "gossiprouter":
                    ours.add(a.name)
                else:
                    others.add(top)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                pkg = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + (
                    [node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != "gossiprouter":
                others.add(base.split(".")[0])
                continue
            for a in node.names:
                ours.add(f"{base}.{a.name}" if _is_module(f"{base}.{a.name}", root) else base)
    return ours, others


def layer(module: str) -> str | None:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")),
               key=len, default=None)
    return None if best is None else LAYERS[best]


def _files(root: Path = ROOT) -> list[Path]:
    return sorted((root / "gossiprouter").rglob("*.py"))


def forbidden_imports(root: Path = ROOT) -> dict[tuple[str, str], str]:
    """Every import that breaks a rule: (importer, imported) -> which rule."""
    found: dict[tuple[str, str], str] = {}
    for f in _files(root):
        me = module_name(f, root)
        mine = layer(me)
        if mine is None:
            continue  # test_every_module_has_a_layer reports it
        ours, others = imports(f, root)
        for target in sorted(ours):
            theirs = layer(target)
            if target != me and theirs not in ALLOWED[mine]:
                found[(me, target)] = f"{mine} may not import {theirs}"
            elif target in FORBIDDEN_MODULES.get(mine, {}):
                found[(me, target)] = (f"{mine} may not import {target}: "
                                       f"{FORBIDDEN_MODULES[mine][target]}")
        if mine in NO_IO or me in NO_IO_MODULES:
            for target in sorted(others & IO_MODULES):
                who = mine if mine in NO_IO else me
                found[(me, target)] = f"{who} stays sans-IO: no {target}"
    return found


def private_attributes(root: Path = ROOT) -> dict[tuple[str, str], list[int]]:
    """In ``ops`` modules, every ``x._name`` (read or written) where ``x`` is not ``self`` or
    ``cls``, and every ``getattr``/``setattr``/``hasattr`` of a literal ``"_name"``:
    (module, attribute) -> line numbers. Dunders (``__name__``) are not private."""
    found: dict[tuple[str, str], list[int]] = {}
    for f in _files(root):
        me = module_name(f, root)
        if layer(me) != "ops":
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            name = None
            if isinstance(node, ast.Attribute) and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                name = node.attr
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "setattr", "hasattr")
                  and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                  and isinstance(node.args[1].value, str)):
                name = node.args[1].value
            if name and name.startswith("_") and not name.endswith("__"):
                assert isinstance(node, ast.expr)
                found.setdefault((me, name), []).append(node.lineno)
    return found


def test_every_module_has_a_layer() -> None:
    lost = [module_name(f) for f in _files() if layer(module_name(f)) is None]
    assert not lost, (f"modules in no layer: {lost}; add them to LAYERS in "
                      "tests/test_dependencies.py and to docs/architecture.md")


def test_no_new_forbidden_import() -> None:
    new = {k: why for k, why in forbidden_imports().items() if k not in KNOWN_VIOLATIONS}
    assert not new, "forbidden imports (see docs/architecture.md, 'Dependency rules'):\n" + \
        "\n".join(f"  {a} -> {b}: {why}" for (a, b), why in sorted(new.items()))


def test_known_violations_still_exist() -> None:
    """An entry whose import is gone is removed from the list, so the list stays the truth."""
    gone = set(KNOWN_VIOLATIONS) - set(forbidden_imports())
    assert not gone, f"fixed, now remove from KNOWN_VIOLATIONS and docs/architecture.md: {gone}"


def test_known_violations_are_documented() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for importer, imported in KNOWN_VIOLATIONS:
        assert f"`{importer}` → `{imported}`" in doc, (importer, imported)


def client_trio_imports(root: Path = ROOT) -> set[str]:
    """The modules of the client package that import trio (anywhere in the file)."""
    return {module_name(f, root) for f in sorted((root / "gossiprouter" / "client").rglob("*.py"))
            if "trio" in imports(f, root)[1]}


def test_the_client_package_imports_no_trio() -> None:
    found = client_trio_imports() - set(CLIENT_TRIO_ALLOWED)
    assert not found, f"the client runs on asyncio too (use anyio): {sorted(found)} import trio"
    gone = set(CLIENT_TRIO_ALLOWED) - client_trio_imports()
    assert not gone, f"no longer imports trio, remove from CLIENT_TRIO_ALLOWED: {gone}"


def test_ops_touches_no_private_attribute() -> None:
    """ops reads the core through the hub and gossiprouter.server.snapshot, not its insides."""
    found = {k: lines for k, lines in private_attributes().items()
             if k not in PRIVATE_ALLOWED}
    assert not found, "private attributes touched by ops (use the hub or a snapshot):\n" + \
        "\n".join(f"  {m}:{lines} {a}" for (m, a), lines in sorted(found.items()))


def test_private_allowances_still_apply() -> None:
    gone = set(PRIVATE_ALLOWED) - set(private_attributes())
    assert not gone, f"no longer touched, remove from PRIVATE_ALLOWED: {gone}"


@pytest.mark.parametrize(("source", "found"), [
    ("n = len(server._per_ip)\n", {"_per_ip"}),
    ("conn.session._rest = b''\n", {"_rest"}),
    ("raw = getattr(stream.socket, '_sock', None)\n", {"_sock"}),
    ("self._state = {}\nx = cls._cache\ny = type(v).__name__\n", set()),
    ("n = view.hub.counters.routed\n", set()),
])
def test_the_checker_sees_a_private_attribute(tmp_path: Path, source: str,
                                              found: set[str]) -> None:
    fake = tmp_path / "gossiprouter" / "ops" / "fake.py"
    fake.parent.mkdir(parents=True)
    fake.write_text(source)
    assert {a for (_, a) in private_attributes(tmp_path)} == found


@pytest.mark.parametrize(("source", "importer", "rule"), [
    ("from gossiprouter.server.listener import Server\n", "gossiprouter.routing.table",
     "routing may not"),
    ("import trio\n", "gossiprouter.sessions.base", "sans-IO"),
    ("from gossiprouter.sessions import base\n", "gossiprouter.stub", "client may not"),
    ("import trio\n", "gossiprouter.client.registrar", "sans-IO"),
    ("from gossiprouter.loadtest.records import X\n", "gossiprouter.ops.admin", "ops may not"),
    ("from gossiprouter.ops.runtime import Operations\n", "gossiprouter.server.listener",
     "server may not"),
    ("from gossiprouter.ops import auth\n", "gossiprouter.sessions.base", "sessions may not"),
    ("from gossiprouter import __version__\n", "gossiprouter.ops.metrics", "ops may not"),
    ("from gossiprouter.ops.runtime import Operations\n", "gossiprouter.router", None),
    ("from gossiprouter.protocol import native\n", "gossiprouter.protocol.errors", None),
])
def test_the_checker_sees_a_forbidden_import(
        tmp_path: Path, source: str, importer: str, rule: str | None) -> None:
    """The checker itself: a planted import is reported with its rule, an allowed one is not."""
    fake = tmp_path / Path(*importer.split(".")).with_suffix(".py")
    fake.parent.mkdir(parents=True)
    fake.write_text(source)
    found = forbidden_imports(tmp_path)
    if rule is None:
        assert found == {}
    else:
        [(key, why)] = found.items()
        assert key[0] == importer and rule in why, (key, why)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Every module of ``gossiprouter`` -> the modules of ``gossiprouter`` it imports, every
    import counted (``TYPE_CHECKING`` ones and those inside functions included)."""
    graph: dict[str, set[str]] = {}
    for f in _files(root):
        me = module_name(f, root)
        graph[me] = {m for m in imports(f, root)[0] if m != me}
    return graph


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """The import circles: each strongly connected component of :func:`import_graph` with more
    than one module, sorted (Tarjan's algorithm, iterative)."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in graph:
                    continue  # a package's __init__ that is not a file of its own
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_no_import_cycles() -> None:
    """No circle in the import graph of gossiprouter, TYPE_CHECKING imports included: break one
    by moving the shared type down a layer, or by passing a callable up (docs/architecture.md,
    "Dependency rules"), not by hiding the import."""
    cycles = import_cycles()
    assert not cycles, "import circles:\n" + "\n".join(
        "  " + " <-> ".join(c) for c in cycles)


@pytest.mark.parametrize(("files", "cycles"), [
    ({"a": "from gossiprouter.pkg import b\n", "b": "x = 1\n"}, []),
    ({"a": "from gossiprouter.pkg.b import X\n", "b": "from gossiprouter.pkg.a import Y\n"},
     [["gossiprouter.pkg.a", "gossiprouter.pkg.b"]]),
    # Only for the type checker, and inside a function: still circles for the reader.
    ({"a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
           "    from gossiprouter.pkg.b import X\n",
      "b": "def f():\n    from gossiprouter.pkg import c\n",
      "c": "from gossiprouter.pkg import a\n"},
     [["gossiprouter.pkg.a", "gossiprouter.pkg.b", "gossiprouter.pkg.c"]]),
])
def test_the_checker_sees_a_cycle(tmp_path: Path, files: dict[str, str],
                                  cycles: list[list[str]]) -> None:
    pkg = tmp_path / "gossiprouter" / "pkg"
    pkg.mkdir(parents=True)
    (tmp_path / "gossiprouter" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    for name, source in files.items():
        (pkg / f"{name}.py").write_text(source)
    assert import_cycles(tmp_path) == cycles


MAX_PY_LINES = 600  # a module past this does two jobs: split it by job (issue 28)
MAX_C_LINES = 700
MAX_LOOSE_FILES = 6  # at the package's top level; everything else lives in its layer's folder


# The same bounds beside the package: the tests' and the benchmarks' own modules and C.
BESIDE = ("tests", "benchmarks")


def test_no_module_is_too_long() -> None:
    beside = [f for d in BESIDE for f in sorted((ROOT / d).rglob("*.py"))]
    long = {str(f.relative_to(ROOT)): n for f in [*_files(), *beside]
            if (n := len(f.read_text().splitlines())) > MAX_PY_LINES}
    long |= {str(f.relative_to(ROOT)): n for d in ("gossiprouter", "benchmarks")
             for f in sorted((ROOT / d).rglob("*.[ch]"))
             if (n := len(f.read_text().splitlines())) > MAX_C_LINES}
    assert not long, f"over {MAX_PY_LINES} lines (.py) or {MAX_C_LINES} (.c/.h): {long}"


def test_the_top_level_holds_only_the_front() -> None:
    loose = sorted(p.name for p in (ROOT / "gossiprouter").iterdir()
                   if p.is_file() and not p.name.endswith(".so"))
    assert len(loose) <= MAX_LOOSE_FILES, loose
    folders = {p.name for p in (ROOT / "gossiprouter").iterdir()
               if p.is_dir() and (p / "__init__.py").is_file()}
    mapped = {name.split(".")[1] for name in LAYERS if name.count(".") == 1}
    assert folders <= mapped, f"folders with no layer in LAYERS: {sorted(folders - mapped)}"
