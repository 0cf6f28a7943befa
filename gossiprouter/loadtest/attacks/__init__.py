"""Hostile clients for load tests: floods, partial frames, huge names, watch floods, admin polling.

A scenario may list ``[[attacks]]`` next to its honest groups (``scripts/scenarios/hostile.toml``;
the format is :mod:`.spec`). Attackers are not members: they never appear in the records or
the membership timeline, so ``gossiprouter analyze`` audits only the honest members, and "0
lost" means the attacks cost the honest members nothing.

All attacks start with sending and stop at the end of the sending phase. They run in their own
process (``python -m gossiprouter.loadtest.attacks CONFIG``, started by the driver), so their
CPU does not slow the honest peers' event loops; the process writes its counters to
``RUN_DIR/attacks.json`` (connections opened, closed by the router, bytes each way, refusals,
admin answers and their slowest time) and its log to ``RUN_DIR/logs/attacks.log``.

The files, one job each:

* :mod:`.spec`: the ``[[attacks]]`` tables of a scenario, their kinds, options and defaults;
* :mod:`.runner`: the driver's side: the router options the attacks need, the attack
  process started and its counters read back;
* :mod:`.process`: the attack process itself (``__main__``): every attack from the start of
  sending to its end, or until SIGTERM, then the counters written;
* :mod:`.base`: what every hostile client shares: its counters, its connections to the
  router, reopened after the router closes them;
* one file per kind of hostile client: :mod:`.flood` (``ping-flood``, ``heartbeat-flood``),
  :mod:`.partial_frames`, :mod:`.huge_names`, :mod:`.watch_flood`, :mod:`.admin_poll`.
"""
