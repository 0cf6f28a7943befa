"""The tables of ``benchmarks/bench_vs_jgroups.py``: the routers it knows by name, and the
medians of their runs printed side by side, with each gossiprouter column's ratio to the Java
router of its protocol and to the C floor."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from benchmarks.vs_jgroups_procs import FLOOR, FLOOR_THREADS

if TYPE_CHECKING:
    from benchmarks.bench_vs_jgroups import RunResult
    from benchmarks.vs_jgroups_load import Case

ROUTERS = ("java", "gr-2.12", "gr-native")
# Only with --jgroups5 CLASSPATH: the Java 5.x router and gossiprouter over the 5.x protocol.
ROUTERS5 = ("java5", "gr-5")
# The light-load floors (from vs_jgroups_procs), native frames: benchmarks/floor/relay.c (FLOOR)
# and its thread-per-connection twin benchmarks/floor/threads.c (FLOOR_THREADS).
FLOORS = (FLOOR, FLOOR_THREADS)
ALL_ROUTERS = (*ROUTERS, *ROUTERS5, *FLOORS)
ROUTER_TITLES = {
    "java": "Java 2.12", "gr-2.12": "gossiprouter 2.12", "gr-native": "gossiprouter native",
    "java5": "Java 5.x", "gr-5": "gossiprouter 5.x", FLOOR: "C floor",
    FLOOR_THREADS: "C floor, threads",
}
# The Java router each gossiprouter column is compared with (same protocol for gr-5).
RATIO_BASE = {"gr-2.12": "java", "gr-native": "java", "gr-5": "java5"}
# The gossiprouter columns also compared with the floor: native (the floor's own frames) and 5.x.
FLOOR_RATIO = ("gr-native", "gr-5")
# With --variant ARGS every gossiprouter router also runs as "<router>+v" with ARGS added,
# alternating with the others, so that a change is measured against its baseline in one run.
VARIANT = "+v"


def base_kind(router: str) -> str:
    return router.removesuffix(VARIANT)


def title(router: str) -> str:
    t = ROUTER_TITLES[base_kind(router)]
    return t + " (variant)" if router.endswith(VARIANT) else t


def median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None and v == v]
    return statistics.median(vals) if vals else None


METRICS: tuple[tuple[str, str, str], ...] = (
    # (RunResult field, label, format)
    ("deliveries_per_s", "deliveries/s", "{:,.0f}"),
    ("router_cpu_us_per_msg", "router CPU µs/msg", "{:.2f}"),
    ("p50_us", "p50 latency µs", "{:,.0f}"),
    ("p99_us", "p99 latency µs", "{:,.0f}"),
    ("echo_per_s", "echoes to the sender/s (not counted)", "{:,.0f}"),
    ("rss_mib", "router RSS MiB", "{:,.1f}"),
    ("registered", "registered (fewest of the runs)", "{:,.0f}"),
    ("router_cpu_cores", "router CPU (cores)", "{:.2f}"),
    ("loader_cpu_cores", "loader CPU (cores)", "{:.2f}"),
)


NO_RATIO = frozenset({"echo_per_s", "registered"})


def _metrics_for(case: Case) -> list[tuple[str, str, str]]:
    wanted = ["deliveries_per_s", "router_cpu_us_per_msg", "router_cpu_cores", "loader_cpu_cores"]
    if case.rate:
        wanted[1:1] = ["p50_us", "p99_us"]
    if case.kind == "idle":
        wanted[1:1] = ["rss_mib", "registered"]
    if case.kind == "fanout":
        wanted[1:1] = ["echo_per_s"]
    return [m for m in METRICS if m[0] in wanted]


def summarize(cases: Sequence[Case], routers: Sequence[str],
              results: Sequence[RunResult]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for case in cases:
        for r in routers:
            runs = [x for x in results if x.case == case.name and x.router == r]
            if not runs:
                continue
            row: dict[str, object] = {"case": case.name, "router": r, "runs": len(runs)}
            for key in (*(m[0] for m in METRICS), "sent_per_s",
                        "machine_busy_cores", "other_cpu_cores", "p90_us", "p999_us",
                        "max_us", "expected_registered", "router_threads"):
                row[key] = median([getattr(x, key) for x in runs])
            # A lost registration in any run must show: the fewest listed, not the median.
            regs = [x.registered for x in runs if x.registered is not None]
            row["registered"] = min(regs) if regs else None
            row["bad_frames"] = sum(x.bad_frames for x in runs)
            row["closed_connections"] = sum(x.closed_connections for x in runs)
            out.append(row)
    return out


def _fmt(v: object, fmt: str) -> str:
    return "n/a" if not isinstance(v, int | float) else fmt.format(v)


def print_table(cases: Sequence[Case], routers: Sequence[str],
                summary: Sequence[dict[str, object]]) -> None:
    cols = [title(r) for r in routers]
    # Each gossiprouter column against the Java router of its protocol family, when it ran,
    # and the native and 5.x ones against the C floor.
    others = [(r, RATIO_BASE[base_kind(r)]) for r in routers
              if RATIO_BASE.get(base_kind(r)) in routers]
    if FLOOR in routers:
        others += [(r, FLOOR) for r in routers if base_kind(r) in FLOOR_RATIO]
    ratio_cols = [_ratio_title(r, base) for r, base in others]
    print("| case | metric | " + " | ".join(cols + ratio_cols) + " |")
    print("|---|---|" + "---:|" * (len(cols) + len(ratio_cols)))
    for case in cases:
        rows = {str(s["router"]): s for s in summary if s["case"] == case.name}
        if not rows:
            continue
        first = True
        for key, label, fmt in _metrics_for(case):
            cells = [_fmt(rows[r][key], fmt) if r in rows else "n/a" for r in routers]
            if key == "registered":
                cells = [
                    f"{c} / {_fmt(rows[r]['expected_registered'], '{:,.0f}')}" if r in rows else c
                    for c, r in zip(cells, routers, strict=True)
                ]
            ratios = []
            if ratio_cols and key in NO_RATIO:
                ratios = [""] * len(others)
            elif ratio_cols:
                ratios = [_ratio(rows, r, base, key) for r, base in others]
            print(f"| {case.title if first else ''} | {label} | "
                  + " | ".join(cells + ratios) + " |")
            first = False


def _ratio_title(router: str, base: str) -> str:
    return f"{title(router).replace('gossiprouter', 'gr')} / {ROUTER_TITLES[base]}"


def _ratio(rows: dict[str, dict[str, object]], router: str, base: str, key: str) -> str:
    b = rows.get(base, {}).get(key)
    v = rows.get(router, {}).get(key)
    if isinstance(v, int | float) and isinstance(b, int | float) and b:
        return f"{v / b:.3g}x"
    return "n/a"


def print_floor_table(cases: Sequence[Case], routers: Sequence[str],
                      summary: Sequence[dict[str, object]]) -> None:
    """The light-load floor table of each paced case: router CPU per message, p50 and p99 of
    every router beside the C floor, and each gossiprouter column over the floor."""
    if FLOOR not in routers:
        return
    others = [r for r in routers if base_kind(r) in FLOOR_RATIO]
    for case in cases:
        rows = {str(s["router"]): s for s in summary if s["case"] == case.name}
        if case.kind != "paced" or FLOOR not in rows:
            continue
        print()
        print(f"Light-load floor, {case.title}: the same Blaster loaders drive every router "
              "(native frames for gossiprouter native and the C floor, JGroups 5.x frames for "
              "Java 5.x and gossiprouter 5.x, 2.12 frames for the 2.12 columns).")
        print()
        ratio_cols = [_ratio_title(r, FLOOR) for r in others]
        print("| metric | " + " | ".join([title(r) for r in routers] + ratio_cols) + " |")
        print("|---|" + "---:|" * (len(routers) + len(ratio_cols)))
        for key, label, fmt in METRICS:
            if key not in ("router_cpu_us_per_msg", "p50_us", "p99_us"):
                continue
            cells = [_fmt(rows[r][key], fmt) if r in rows else "n/a" for r in routers]
            cells += [_ratio(rows, r, FLOOR, key) for r in others]
            print(f"| {label} | " + " | ".join(cells) + " |")
