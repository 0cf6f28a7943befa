"""What the ROUTE audit found: the anomalies (losses, duplicates, out-of-order, undetermined
and unexpected deliveries) counted and sampled with Spark (:func:`sample_anomalies`), and,
in Python on the aggregated rows, the report's :class:`~gossiprouter.analytics.report.parts.Audit`
(:func:`audit_from`) and its breakdowns by group and by peer process
(:func:`breakdowns`, :func:`by_process`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from gossiprouter.analytics.report.parts import Audit, Breakdown, Finding
from gossiprouter.analytics.spark_io import rows
from gossiprouter.analytics.timeline import NS_PER_S

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["audit_from", "breakdowns", "by_process", "no_anomalies", "sample_anomalies", "total"]


# Times in the samples are turned into seconds since the start of the run (t_send_s ...)
# by audit_from.
_LOST_FIELDS: Final = ("msg_id", "group", "sender", "seq", "receiver", "cast", "t_send_ns",
                       "receiver_status")
_SAMPLE_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "lost": _LOST_FIELDS,
    "lost_registered": _LOST_FIELDS,
    "lost_reconnect": _LOST_FIELDS,
    "undetermined": ("msg_id", "group", "sender", "seq", "receiver", "cast", "t_send_ns",
                     "t_recv_ns", "receiver_status"),
    "unexpected": ("msg_id", "group", "sender", "seq", "receiver", "cast", "dest",
                   "t_recv_ns"),
    "duplicated": ("msg_id", "group", "sender", "seq", "receiver", "copies"),
    "out_of_order": ("msg_id", "group", "sender", "seq", "receiver", "t_recv_ns",
                     "after_seq"),
}


def sample_anomalies(
    pairs: DataFrame, parts: int, sample_size: int, *, flagged: bool = True,
) -> dict[str, tuple[int, int, list[dict[str, Any]]]]:
    """For each kind of anomaly: (count, distinct (group, sender, receiver), sample), the
    sample of up to ``sample_size`` examples, deterministically chosen. ``flagged=False``
    says the pairs hold no loss, duplicate, undetermined or unexpected delivery (their
    counts were 0): then only the order is checked."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    col, cat = F.col, F.col("category")
    common = ["msg_id", "group", "sender", "seq", "receiver", "cast", "dest", "t_send_ns",
              "t_recv_ns", "receiver_status", "copies"]
    flagged_rows = pairs.filter(
        cat.isin("lost", "lost_reconnect", "unexpected", "undetermined_delivered",
                 "undetermined_missing") | (col("copies") > 1)
    ).select(
        F.explode(F.array_compact(F.array(
            F.when(cat.isin("lost", "lost_reconnect"), "lost"),
            F.when(cat == "lost", "lost_registered"),
            F.when(cat == "lost_reconnect", "lost_reconnect"),
            F.when(cat.startswith("undetermined"), "undetermined"),
            F.when(cat == "unexpected", "unexpected"),
            F.when(col("copies") > 1, "duplicated"),
        ))).alias("kind"),
        *common, F.lit(None).cast("bigint").alias("after_seq"),
    )
    # Out of order: a first copy that arrives after a higher seq from the same sender in
    # the same group (one router connection each way, so FIFO is expected there). Ties in
    # receive time are broken by seq so that they never count.
    w = (Window.partitionBy("group", "sender", "receiver")
         .orderBy("t_recv_ns", "seq")
         .rowsBetween(Window.unboundedPreceding, -1))
    null_str = F.lit(None).cast("string")
    late = (pairs.filter(col("copies") > 0)
            .select("msg_id", "group", "sender", "seq", "receiver", "t_recv_ns")
            .repartition(parts, "group", "sender", "receiver")
            .withColumn("after_seq", F.max("seq").over(w))
            .filter(col("seq") < col("after_seq"))
            .select(F.lit("out_of_order").alias("kind"), "msg_id", "group", "sender", "seq",
                    "receiver", null_str.alias("cast"), null_str.alias("dest"),
                    F.lit(None).cast("bigint").alias("t_send_ns"), "t_recv_ns",
                    null_str.alias("receiver_status"),
                    F.lit(None).cast("bigint").alias("copies"), "after_seq"))
    order = ["group", "sender", "seq", "receiver"]
    by_kind = Window.partitionBy("kind")
    ranked = (
        (flagged_rows.unionByName(late) if flagged else late)
        .withColumn("rn", F.row_number().over(by_kind.orderBy(*order)))
        .withColumn("pair_rank",
                    F.dense_rank().over(by_kind.orderBy("group", "sender", "receiver")))
        .withColumn("n", F.count(F.lit(1)).over(by_kind))
        .withColumn("pairs", F.max("pair_rank").over(by_kind))
        .filter(col("rn") <= max(sample_size, 1))
    )
    found = no_anomalies()
    for r in sorted(rows(ranked), key=lambda r: int(r["rn"])):
        sample = found[r["kind"]][2]
        if len(sample) < sample_size:
            sample.append({f: r[f] for f in _SAMPLE_FIELDS[r["kind"]]})
        found[r["kind"]] = (int(r["n"]), int(r["pairs"]), sample)
    return found


def no_anomalies() -> dict[str, tuple[int, int, list[dict[str, Any]]]]:
    """What :func:`sample_anomalies` returns for pairs without any anomaly."""
    return {kind: (0, 0, []) for kind in _SAMPLE_FIELDS}


def total(rows: Iterable[Mapping[str, Any]], field: str) -> int:
    """The sum of ``field`` over collected ``rows`` (a null counts 0)."""
    return sum(int(r[field] or 0) for r in rows)


def audit_from(
    cats: list[dict[str, Any]],
    anomalies: Mapping[str, tuple[int, int, list[dict[str, Any]]]],
    origin: int,
) -> Audit:
    """The :class:`~gossiprouter.analytics.report.parts.Audit` of the run: the counts from
    the (category, receiver_status, receiver, group) aggregation of the pairs (``cats``),
    the samples from :func:`sample_anomalies`, their times in seconds since ``origin``."""

    def count(category: str, status: str | None = None) -> int:
        return total((r for r in cats if r["category"] == category
                      and (status is None or r["receiver_status"] == status)), "pairs")

    def relative(sample: dict[str, Any]) -> dict[str, Any]:
        # Monotonic nanoseconds mean nothing to a reader: seconds since the start.
        return {(k[:-3] + "_s" if k in ("t_send_ns", "t_recv_ns") else k):
                (None if v is None else round((v - origin) / NS_PER_S, 6))
                if k in ("t_send_ns", "t_recv_ns") else v
                for k, v in sample.items()}

    def finding(kind: str, n: int | None = None) -> Finding:
        found, _, sample = anomalies[kind]
        return Finding(found if n is None else n, [relative(x) for x in sample])

    lost_all = count("lost") + count("lost_reconnect")
    undetermined = count("undetermined_delivered") + count("undetermined_missing")
    return Audit(
        expected=count("delivered") + lost_all,
        delivered=count("delivered"),
        lost=finding("lost", lost_all),
        lost_registered=finding("lost_registered", count("lost")),
        lost_reconnect=finding("lost_reconnect", count("lost_reconnect")),
        lost_to_left=count("lost", "left"),
        lost_to_killed=count("lost", "killed"),
        duplicated=finding("duplicated", total(cats, "duplicated")),
        duplicate_copies=total(cats, "extra_copies"),
        out_of_order=finding("out_of_order"),
        out_of_order_pairs=anomalies["out_of_order"][1],
        undetermined=finding("undetermined", undetermined),
        undetermined_delivered=count("undetermined_delivered"),
        unexpected=finding("unexpected", count("unexpected")),
    )


_CATEGORY_FIELD: Final = {"delivered": "delivered", "lost": "lost_registered",
                          "lost_reconnect": "lost_reconnect",
                          "undetermined_delivered": "undetermined",
                          "undetermined_missing": "undetermined"}


def breakdowns(
    senders: list[dict[str, Any]],
    cats: list[dict[str, Any]],
    key: Callable[[str], str | None],
    by: str = "group",
) -> dict[str, Breakdown]:
    """Breakdowns keyed by ``key(row[by])`` (rows whose key is None are left out): sends
    by sender (or group), the rest by receiver (or group)."""
    out: dict[str, Breakdown] = {}
    for r in senders:
        k = key(str(r["group" if by == "group" else "sender"]))
        if k is not None:
            out.setdefault(k, Breakdown()).sent += int(r["messages"] or 0)
    for r in cats:
        k = key(str(r["group" if by == "group" else "receiver"]))
        if k is None:
            continue
        b = out.setdefault(k, Breakdown())
        field = _CATEGORY_FIELD.get(str(r["category"]))
        n = int(r["pairs"] or 0)
        if field is not None:
            setattr(b, field, getattr(b, field) + n)
        if r["category"] in ("delivered", "lost", "lost_reconnect"):
            b.expected += n
        b.duplicated += int(r["duplicated"] or 0)
    return dict(sorted(out.items()))


def by_process(
    manifest: dict[str, Any] | None,
    senders: list[dict[str, Any]],
    cats: list[dict[str, Any]],
) -> dict[str, Breakdown]:
    """Breakdowns by peer process ("p0", ...), from the manifest's list of processes."""
    procs = (manifest or {}).get("processes")
    if not isinstance(procs, list):
        return {}
    of: dict[str, str] = {}
    for p in procs:
        if isinstance(p, dict) and isinstance(p.get("members"), list):
            for m in p["members"]:
                of[str(m)] = f"p{p.get('proc')}"
    if not of:
        return {}
    found = breakdowns(senders, cats, of.get, by="member")
    return dict(sorted(found.items(), key=lambda kv: (len(kv[0]), kv[0])))
