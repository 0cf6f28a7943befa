"""Operations and security around the router core.

Everything an operator touches but the routing core does not need: TLS on
the router port (:mod:`.tls`), client-network allow-lists (:mod:`.access`),
native-protocol tokens (:mod:`.auth`), Prometheus metrics (:mod:`.metrics`),
the read-only HTTP admin view (:mod:`.admin`), JSON logs (:mod:`.logs`), the
``gossiprouter dump`` command (:mod:`.dump`), and the glue the server calls
(:mod:`.runtime`).

How the core reaches this package, as the imports say (tests/test_dependencies.py
holds them to it; docs/architecture.md has the rules):

* the server builds :class:`gossiprouter.ops.runtime.Operations` and calls it at accept,
  at protocol detection and on reload; besides that it imports two building blocks,
  :class:`.tls.TLSStream` (the stream it reads from) and :class:`.access.RateLimitedLog`;
* the sessions name :class:`.auth.Authenticator` as a type only;
* the other way, :mod:`.runtime`, :mod:`.metrics` and :mod:`.admin` import the server's
  classes for type checking only, but read its connections, outboxes and routing table
  at run time (issue 14, item 4, replaces that with hooks and snapshots).
"""
