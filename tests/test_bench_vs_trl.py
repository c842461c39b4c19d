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


def test_a_kept_warm_up_is_reused_and_the_lr_reaches_sft(tmp_path, monkeypatch):
    seen = []
    real = vs_trl.sft_warmup
    monkeypatch.setattr(
        vs_trl,
        "sft_warmup",
        lambda m, t, s, cfg, seed, on_step: seen.append(cfg) or real(m, t, s, cfg, seed, on_step),
    )
    workload = {"task": {"name": "addition", "args": {}}, "sft_steps": 2}
    out = vs_trl.sft_start(workload, 0, tmp_path / "start", "tiny", steps=1, lr=5e-4)
    assert [(c.steps, c.lr) for c in seen] == [(1, 5e-4)]
    assert (out / "config.json").exists() and not (tmp_path / "start.partial").exists()
    # kept: the second call trains nothing, even for a workload it could not build
    assert vs_trl.sft_start({"task": {"name": "nope", "args": {}}, "sft_steps": 9}, 0, out) == out
    assert len(seen) == 1
    vs_trl.sft_start(workload, 0, tmp_path / "other", "tiny")
    assert [(c.steps, c.lr) for c in seen[1:]] == [(2, 1e-3)]  # the workload's steps, SFT's default lr


def test_no_time_ratio_for_a_target_the_start_already_scores():
    # both start at 0.3 (their first step); TRL rises to 0.6, schedrl falls to 0.2 and then reaches 0.4
    trl = run([0.3] + [0.6] * 59, 2.0)
    schedrl = run([0.3] + [0.2] * 29 + [0.4] * 30, 1.0)
    per = {"trl": [trl], "schedrl": [schedrl]}
    assert vs_trl.start_reward(per) == 0.3
    # above the start: TRL's first full window (step 20, 40 s); schedrl's window at step n >= 30 averages
    # 0.2 + 0.01 (n - 30), which first reaches 0.355 at step 46
    assert vs_trl.learning_time_ratios(per, 0.355) == [40.0 / 46.0]
    # 0.255, below the start: the times exist (schedrl at step 36) but measure no learning
    assert vs_trl.time_ratios([trl], [schedrl], 0.255) == [40.0 / 36.0]
    assert vs_trl.learning_time_ratios(per, 0.255) == []
    assert vs_trl.learning_time_ratios(per, 0.3) == []  # at the start's reward exactly: none either


def test_a_run_at_small_plots_under_its_own_name():
    assert vs_trl.default_plot("tiny").format(workload="longtail") == "docs/vs_trl_longtail.png"
    assert vs_trl.default_plot("small").format(workload="longtail") == "docs/vs_trl_small_longtail.png"
