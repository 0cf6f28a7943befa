"""Operations and security around the router core.

Everything an operator touches but the routing core does not need: TLS on
the router port (:mod:`.tls`), client-network allow-lists (:mod:`.access`),
native-protocol tokens (:mod:`.auth`), Prometheus metrics (:mod:`.metrics`),
the read-only HTTP admin view (:mod:`.admin`), JSON logs (:mod:`.logs`), the
``gossiprouter dump`` command (:mod:`.dump`), and the server's hooks (:mod:`.runtime`) with
their counters (:mod:`.stats`).

This package depends on the core, one way (tests/test_dependencies.py holds the imports
to it; docs/architecture.md has the rules):

* the core imports nothing from here. The server defines what it calls,
  :class:`gossiprouter.server.hooks.ServerHooks` (accept, admit, refused, serve, and the token
  authority), and :class:`.runtime.Operations` implements it; whoever builds the server
  (``gossiprouter serve``, :class:`gossiprouter.router.Router`) builds both and hands
  the one to the other. The sessions name their token authority by a Protocol of their
  own (:class:`gossiprouter.sessions.base.Authority`), which :class:`.auth.Authenticator`
  satisfies;
* :mod:`.metrics` and :mod:`.admin` read the router through the hub and the snapshots of
  :mod:`gossiprouter.server.snapshot` (a :class:`~gossiprouter.server.snapshot.RouterView` given to
  :meth:`.runtime.Operations.serve`), never the server's connections or outboxes;
  tests/test_dependencies.py also refuses any ``obj._private`` attribute read here.
"""
