"""benchmarks/bench_federation.py in small (CI's smoke run): every case runs and measures
something, on real routers federated through a real mosquitto. What it counts is checked
here, not speed: the figures are docs/performance.md's."""

from __future__ import annotations

import re
import shutil
from functools import partial

import pytest
import trio

from benchmarks import bench_federation as bench
from benchmarks import federation_mix
from gossiprouter.loadtest.processes import MOSQUITTO


@pytest.mark.slow
def test_every_case_measures_something() -> None:
    if not shutil.which(MOSQUITTO):
        pytest.fail("mosquitto is not installed (scripts/setup installs it)")
    res = trio.run(bench.run, 5, 4, 100, 20, 10.0, lambda _: None, 1, 30, 1000.0, 120)
    assert res.federated
    for row in res.rows:
        assert row.note == "", row
        if row.case.startswith("throughput"):
            # 100 unicasts across routers, 10 times as many within one.
            want = 100 if "across" in row.case else 100 * bench.LOCAL_FACTOR
            assert row.samples == want and row.rate and row.cpu_us is not None, row
        else:
            # 5 messages, to 1 receiver (unicast) or 3 (the 4-member group).
            assert row.samples == 5 * (1 if row.case.startswith("unicast") else 3), row
            assert row.p50_us is not None and row.p99_us is not None and row.p50_us > 0
    # The interleaved and burst cases: every delivery arrived (30 or 120 messages, a sixth
    # of them multicasts to the 5 receivers), and the ratio lines are printed.
    assert set(res.mix) == {bench.MIX_LOCAL, bench.MIX_FAR, bench.BUNDLE_LOCAL, bench.BUNDLE_FAR,
                            bench.BURST_FED, bench.BURST_ONE}
    for name, m in res.mix.items():
        n = 120 if name.startswith("burst") else 30
        assert m.messages == n and m.expected == m.delivered == n // 6 * 10, (name, m)
        assert bench.mix_shown(name, m), name
        # The CPU split by process: every process measured once, in its role.
        want_roles = ({bench.SENDING: 1} if "no bridge" in name else
                      {bench.SENDING: 1, bench.RECEIVING: 2, bench.BROKER: 1})
        assert {r: n for r, (_, n) in m.cpu_by.items()} == want_roles, (name, m.cpu_by)
        assert abs(sum(s for s, _ in m.cpu_by.values()) - m.cpu_s) < 1e-6, (name, m)
        # ...and the kernel's part of it (system time), by the same roles.
        assert set(m.sys_by) == set(want_roles), (name, m.sys_by)
        assert abs(sum(m.sys_by.values()) - m.sys_s) < 1e-6 and m.sys_s <= m.cpu_s, (name, m)
    res.wake_floor = federation_mix.wake_floor(20)
    assert all(v > 0 for v in res.wake_floor)
    assert res.joins_s is not None and res.converge_s is not None
    assert res.converge_s >= res.joins_s
    lines: list[str] = []
    bench.print_table(res, 20, lines.append)
    assert any(line.startswith("broker hop, unicast, p50: ") for line in lines), lines
    for start in ("interleaved across routers, p50: ", "interleaved CPU per message, across",
                  "interleaved, 6 a tick, across routers, p50: ",
                  "burst, local receiver, federated group / group on one router, p50: ",
                  "CPU µs per message, per process", f"{bench.MIX_FAR:<58} ",
                  "a wake-up of Python with nothing to do, 1,000/s: trio "):
        assert any(line.startswith(start) for line in lines), (start, lines)
    assert any(re.match(r"convergence, 20 joins on each of 3 routers: \d+\.\d{3} s", line)
               for line in lines), lines


@pytest.mark.slow
@pytest.mark.parametrize("framing", [federation_mix.JGROUPS5, federation_mix.JGROUPS2],
                         ids=lambda f: f.name)
def test_the_mix_cases_with_jgroups_members_deliver_everything(
        framing: federation_mix.Framing) -> None:
    """``--members jgroups5`` and ``jgroups2``: the interleaved and burst cases with JGroups
    members (the sender's own multicast copies are not counted), every delivery arrived."""
    if not shutil.which(MOSQUITTO):
        pytest.fail("mosquitto is not installed (scripts/setup installs it)")
    res = trio.run(partial(bench.run, 5, 4, 100, 20, 10.0, lambda _: None, 1, 30, 1000.0, 120,
                           only_mix=True, framing=framing))
    assert res.federated and res.only_mix
    assert len(res.mix) == 6
    for name, m in res.mix.items():
        n = 120 if name.startswith("burst") else 30
        assert m.messages == n and m.expected == m.delivered == n // 6 * 10, (name, m)


def test_cpu_latency_option_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    """--cpu-latency-us (bench_vs_jgroups' option, here too) refuses a negative value before
    anything starts."""
    with pytest.raises(SystemExit):
        bench.main(["--cpu-latency-us", "-1", "--only-mix"])
    assert "--cpu-latency-us: expected 0 or more" in capsys.readouterr().err
