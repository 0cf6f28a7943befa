"""benchmarks/bench_federation_floor.py in small: the C relay federated through a real
mosquitto routes what gossiprouter's routers route (every delivery of the interleaved traffic
arrives, unicasts and multicasts, across relays), and the table gives the ratios. Speed is
docs/performance.md's, not checked here."""

from __future__ import annotations

import shutil

import pytest

from benchmarks import bench_federation_floor as floor
from gossiprouter.loadtest.processes import MOSQUITTO


@pytest.mark.slow
def test_every_case_delivers_everything_and_the_ratios_are_printed() -> None:
    if not shutil.which(MOSQUITTO):
        pytest.fail("mosquitto is not installed (scripts/setup installs it)")
    res = floor.run(1, 60, 1000.0, 10.0, lambda _: None)
    assert set(res) == {floor.GR_ONE, floor.GR_FAR, floor.C_ONE, floor.C_FAR}
    for name, m in res.items():
        # 60 messages, a sixth of them multicasts to the 5 receivers: 100 deliveries.
        assert m.messages == 60 and m.expected == m.delivered == 100, (name, m)
        across = name in (floor.GR_FAR, floor.C_FAR)
        # Across routers, 4 of the 5 receivers are on the other two.
        assert len(m.lat.get("remote", [])) == (80 if across else 0), name
        assert set(m.cpu_by) == ({floor.SENDING, floor.RECEIVING, floor.BROKER} if across
                                 else {floor.SENDING}), name
    lines: list[str] = []
    floor.table(res, lines.append)
    assert any(line.startswith(floor.C_FAR) for line in lines), lines
    # The ratios need gossiprouter alone above /proc's 10 ms tick: in 60 messages it may
    # not be, and the table says so instead.
    assert any(line.startswith("CPU per message, the C relay across relays / gossiprouter")
               or "below /proc's 10 ms tick" in line for line in lines), lines


def test_bad_arguments_are_refused_before_anything_starts(
        capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--mix", "0"], ["--rounds", "0"], ["--rate", "-1"]):
        with pytest.raises(SystemExit) as e:
            floor.main(argv)
        assert e.value.code == 2, argv
        assert "--rounds must be at least 1" in capsys.readouterr().err, argv
