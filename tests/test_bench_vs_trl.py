"""bench/vs_trl.py's time-to-target arithmetic on hand-made curves."""

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import vs_trl  # noqa: E402


def run(rewards, seconds_per_step=1.0):
    return {"curve": rewards, "elapsed": [seconds_per_step * (i + 1) for i in range(len(rewards))]}


def test_time_to_waits_for_a_full_window_of_the_moving_average():
    curve = [0.0] * 10 + [1.0] * 30
    assert vs_trl.time_to(run(curve), 0.5) == 20.0  # the first full window: 10 of 20 are ones
    assert vs_trl.time_to(run(curve, 0.5), 0.55) == 10.5  # 11 of 20 at step 21
    early = [1.0] * 5 + [0.0] * 35  # the partial windows of steps 1-5 average 1.0; no full one reaches 0.3
    assert vs_trl.time_to(run(early), 0.3) == math.inf


def test_time_ratios_leave_out_seeds_where_neither_system_reaches_the_target():
    up, flat = [0.0] * 20 + [1.0] * 40, [0.0] * 60
    trl = [run(up, 2.0), run(flat), run(up, 2.0)]
    schedrl = [run(up, 1.0), run(flat), run(flat)]
    # seed 0: 2x sooner; seed 1: neither reaches 0.5 (left out); seed 2: only TRL does (ratio 0)
    assert vs_trl.time_ratios(trl, schedrl, 0.5) == [2.0, 0.0]
    assert vs_trl.time_ratios(schedrl, trl, 0.5) == [0.5, math.inf]
