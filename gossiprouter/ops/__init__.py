"""Operations and security around the router core.

Everything an operator touches but the routing core does not need: TLS on
the router port (:mod:`.tls`), client-network allow-lists (:mod:`.access`),
native-protocol tokens (:mod:`.auth`), Prometheus metrics (:mod:`.metrics`),
the read-only HTTP admin view (:mod:`.admin`), JSON logs (:mod:`.logs`), the
``gossiprouter dump`` command (:mod:`.dump`), and the glue the server calls
(:mod:`.runtime`). The server reaches this package only through
:class:`gossiprouter.ops.runtime.Operations`.
"""
