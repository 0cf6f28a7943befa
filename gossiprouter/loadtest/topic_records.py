"""The record format of a topic-multicast load test (``gossiprouter loadtest-topics --out``).

The contract between :mod:`gossiprouter.loadtest.topics` (which writes the records) and
:mod:`gossiprouter.analytics.topics_audit` (the Spark job that audits them), beside the
ROUTE load test's :mod:`gossiprouter.loadtest.records` and with its conventions: pyarrow
only (no Spark needed to write), every file written whole under a hidden name and renamed
into place, one clock for every time (all of a topics run happens in one process).

Layout of a topics run directory
================================

``RUN_DIR/manifest.json``
    A JSON object with ``"kind": "topics"`` (which is how ``gossiprouter analyze`` tells a
    topics run from a ROUTE run), the scenario (``scenario_config``), ``settle_s``,
    ``t0_ns`` (the start of the load), ``status`` (``running``, ``ok``, ``failed``,
    ``interrupted``) and the in-process audit's figures (``in_process_audit``).

``RUN_DIR/topics/publications.parquet`` (:data:`PUBLICATION_SCHEMA`), one row per publication:
    ``pub_id`` (``publisher/seq``), ``publisher`` (member name), ``router`` (index of the
    publisher's router), ``scope`` (``local`` / ``global``), ``topic`` (the multicast id as
    ``provider/broadcast/partition...``), ``size``, ``t_send_ns`` (just before the publish).

``RUN_DIR/topics/subscriptions.parquet`` (:data:`SUBSCRIPTION_SCHEMA`), one row per span
during which a subscriber held a pattern:
    ``subscriber``, ``router``, ``pattern`` (``+``/``*`` as in the CLI), ``from_ns`` (the
    SUBSCRIBE was requested), ``settled_from_ns`` (accepted + settle: by then every bridge
    of the federation has subscribed the broker; null if it never was accepted),
    ``to_ns`` (the UNSUBSCRIBE was requested; null if held to the end) and
    ``settled_to_ns`` (the UNSUBSCRIBE accepted + settle; null if held, or never accepted).

``RUN_DIR/topics/deliveries.parquet`` (:data:`DELIVERY_SCHEMA`), one row per copy received,
duplicates included:
    ``pub_id``, ``receiver``, ``router`` (the receiver's), ``scope`` (as delivered),
    ``t_recv_ns``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

import pyarrow as pa

from gossiprouter.loadtest.records import write_table

__all__ = ["DELIVERIES_FILE", "DELIVERY_SCHEMA", "KIND", "PUBLICATIONS_FILE",
           "PUBLICATION_SCHEMA", "SUBSCRIPTIONS_FILE", "SUBSCRIPTION_SCHEMA", "TOPICS_DIR",
           "write_topic_table"]

KIND: Final = "topics"
TOPICS_DIR: Final = "topics"
PUBLICATIONS_FILE: Final = "publications.parquet"
SUBSCRIPTIONS_FILE: Final = "subscriptions.parquet"
DELIVERIES_FILE: Final = "deliveries.parquet"

PUBLICATION_SCHEMA: Final = pa.schema([
    pa.field("run", pa.string(), nullable=False),
    pa.field("pub_id", pa.string(), nullable=False),
    pa.field("publisher", pa.string(), nullable=False),
    pa.field("router", pa.int32(), nullable=False),
    pa.field("scope", pa.string(), nullable=False),
    pa.field("topic", pa.string(), nullable=False),
    pa.field("size", pa.int32(), nullable=False),
    pa.field("t_send_ns", pa.int64(), nullable=False),
])
SUBSCRIPTION_SCHEMA: Final = pa.schema([
    pa.field("run", pa.string(), nullable=False),
    pa.field("subscriber", pa.string(), nullable=False),
    pa.field("router", pa.int32(), nullable=False),
    pa.field("pattern", pa.string(), nullable=False),
    pa.field("from_ns", pa.int64(), nullable=False),
    pa.field("settled_from_ns", pa.int64(), nullable=True),
    pa.field("to_ns", pa.int64(), nullable=True),
    pa.field("settled_to_ns", pa.int64(), nullable=True),
])
DELIVERY_SCHEMA: Final = pa.schema([
    pa.field("run", pa.string(), nullable=False),
    pa.field("pub_id", pa.string(), nullable=False),
    pa.field("receiver", pa.string(), nullable=False),
    pa.field("router", pa.int32(), nullable=False),
    pa.field("scope", pa.string(), nullable=False),
    pa.field("t_recv_ns", pa.int64(), nullable=False),
])

SCHEMAS: Final = {PUBLICATIONS_FILE: PUBLICATION_SCHEMA,
                  SUBSCRIPTIONS_FILE: SUBSCRIPTION_SCHEMA, DELIVERIES_FILE: DELIVERY_SCHEMA}


def write_topic_table(run_dir: str | os.PathLike[str], name: str,
                      columns: dict[str, list[object]]) -> Path:
    """Write ``RUN_DIR/topics/name`` (one of the three files above) from its columns,
    atomically; returns the path."""
    table = pa.Table.from_pydict(columns, schema=SCHEMAS[name])
    return write_table(Path(run_dir) / TOPICS_DIR, name, table)
