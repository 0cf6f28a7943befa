"""One case of a micro-benchmark, under cProfile when asked (their ``--profile``): what
bench_hotloop.py and bench_jgroups_hotloop.py share."""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable


def measured(run: Callable[[], float], profile: bool, lines: int) -> float:
    """``run()``'s figure; with ``profile``, run under cProfile, and the ``lines`` functions
    with the most time of their own are printed after it."""
    if not profile:
        return run()
    prof = cProfile.Profile()
    prof.enable()
    figure = run()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(lines)
    return figure
