"""Expected deliveries against the deliveries made, with Spark: the tables the ROUTE audit
works from (:func:`delivery_tables`). Every (message, receiver) pair that was expected
(the receiver a member of the group for the whole settle window), undetermined (a member
for part of it) or received gets one row, with the copies received, the first receive
time and its category: delivered, lost, lost across a reconnect, undetermined (delivered
or missing) or unexpected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from gossiprouter.analytics.spark_io import local_frame
from gossiprouter.analytics.timeline import Interval

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["delivery_tables"]


_SEND, _RECV, _BAD = 0, 1, 2  # record kinds, as codes
_STATUS_CODE: Final = {"stayed": 0, "left": 1, "killed": 2}


def delivery_tables(
    spark: SparkSession, records: DataFrame, intervals: list[Interval], parts: int,
    outages: list[tuple[int, int, list[str]]], settle_ns: int,
    cache: Callable[[DataFrame], DataFrame],
) -> tuple[DataFrame, DataFrame]:
    """The cached tables the analysis works from.

    ``msgs``: one row per message with its attributes. ``pairs``: one row per (message,
    receiver) that was expected, undetermined or received, with copies received, first
    receive time and category.

    Both come from the records shuffled by msg_id (``recs``), which are not cached:
    building and compressing a cached copy of every record cost more than reading and
    shuffling them again for the received side (measured on 1.5 million records: a
    quarter of the CPU time of this step). Everything is keyed by msg_id first, so the
    shuffle of the records serves both: Spark keeps the hash partitioning by msg_id
    through the aggregations, the broadcast join with the membership intervals, the union
    and the final join. The caller runs with adaptive execution off, so the plans know
    the cached tables' partitioning before they are materialised: the first count of
    ``pairs`` builds both in one job.

    ``settle_ns`` is the settle window, ``outages`` come from :func:`router_outages
    <gossiprouter.analytics.timeline.router_outages>`, ``parts`` is the number of
    partitions; ``cache(df)`` persists a table (the job unpersists them at the end).
    """
    from pyspark.sql import functions as F

    col = F.col
    valid_recv = ((col("kind") == "recv") & col("receiver").isNotNull()
                  & col("t_recv_ns").isNotNull())
    # Small integer codes rather than strings wherever Spark aggregates a value: string
    # aggregation buffers force a sort-based aggregation, fixed-width ones allow hashing.
    k = F.when(col("kind") == "send", _SEND).when(valid_recv, _RECV).otherwise(_BAD)
    keys = ["sender", "group", "cast", "dest", "run"]
    nums = ["seq", "size", "t_send_ns"]
    recs = records.select(
        "msg_id", "receiver", "t_recv_ns", *keys, *nums, k.alias("k")
    ).repartition(parts, "msg_id")
    # Receivers copy the message attributes from the payload, so recv rows stand in for a
    # send row the sender never flushed (a killed sender, say). The string attributes are
    # grouping keys (the same in every row of a message) so the aggregation can hash.
    msgs = cache(recs.filter(col("k") != _BAD).groupBy("msg_id", *keys).agg(
        *[F.max(c).alias(c) for c in nums],
        F.count_if(col("k") == _SEND).alias("n_send"),
    ))

    iv = local_frame(
        spark,
        [(i.group, i.member, i.start_ns, i.end_ns, i.next_start_ns, _STATUS_CODE[i.status])
         for i in intervals],
        "iv_group STRING, member STRING, start_ns BIGINT, end_ns BIGINT, "
        "next_start_ns BIGINT, status INT",
    )
    t_send = col("t_send_ns")
    window_end = t_send + F.lit(settle_ns)
    # Of a member's (disjoint) intervals only the last one starting by the end of the
    # window can overlap the window, so each (message, member) yields at most one row.
    candidates = msgs.join(
        F.broadcast(iv),
        (col("group") == col("iv_group"))
        & (col("member") != col("sender"))
        & ((col("cast") == "multicast") | (col("member") == col("dest")))
        & (col("start_ns") <= window_end)
        & (col("next_start_ns").isNull() | (col("next_start_ns") > window_end))
        & (col("end_ns").isNull() | (col("end_ns") >= t_send)),
    ).select(
        "msg_id", col("member").alias("receiver"), F.lit(0).alias("copy"),
        F.lit(None).cast("bigint").alias("t_recv_ns"),
        ((col("start_ns") <= t_send)
         & (col("end_ns").isNull() | (col("end_ns") >= window_end))).alias("expected"),
        "status",
    )
    received = recs.filter(col("k") == _RECV).select(
        "msg_id", "receiver", F.lit(1).alias("copy"), "t_recv_ns",
        F.lit(None).cast("boolean").alias("expected"), F.lit(None).cast("int").alias("status"),
    )
    per_pair = candidates.unionByName(received).groupBy("msg_id", "receiver").agg(
        F.sum("copy").alias("copies"),
        F.min("t_recv_ns").alias("t_recv_ns"),
        F.max("expected").alias("expected"),
        F.max("status").alias("status"),
    )
    copies, expected, status = col("copies"), col("expected"), col("status")
    # A loss whose window [t_send, t_send + settle] overlaps a router outage (down until
    # every member was registered again) happened across a reconnect; in a federation,
    # only if the sender or the receiver is on the router that was down.
    across = F.lit(False)
    for start, end, members in outages:
        cut = (t_send <= F.lit(end)) & (window_end >= F.lit(start))
        if members:
            cut = cut & (col("sender").isin(members) | col("receiver").isin(members))
        across = across | cut
    pairs = cache(per_pair.join(
        # Both sides are already partitioned by msg_id: a per-partition hash join avoids
        # sorting them.
        msgs.select("msg_id", *keys, *nums).hint("shuffle_hash"), "msg_id",
    ).select(
        "msg_id", "receiver", *keys, *nums, "copies", "t_recv_ns",
        F.when(status == _STATUS_CODE["stayed"], "stayed")
        .when(status == _STATUS_CODE["left"], "left")
        .when(status == _STATUS_CODE["killed"], "killed")
        .alias("receiver_status"),
        F.when(expected.isNull(), "unexpected")
        .when(expected & (copies > 0), "delivered")
        .when(expected & across, "lost_reconnect")
        .when(expected, "lost")
        .when(copies > 0, "undetermined_delivered")
        .otherwise("undetermined_missing")
        .alias("category"),
    ))
    return msgs, pairs
