"""The short chaos run (bench/chaos.py has the full one): runs SIGKILLed at a random moment and inside
the checkpoint protocol, resumed, and checked: sync metrics identical, async nothing lost or repeated."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import chaos  # noqa: E402
import pytest  # noqa: E402

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.train("real runs SIGKILLed twice each and resumed, checked against uninterrupted runs"),
]


def test_sync_kills_resume_to_identical_metrics(tmp_path):
    out = chaos.run_mode("sync", 2, random.Random(0), tmp_path, places=("moment", "synced"))
    assert out["kills"] + out["finished_before_kill"] == 2 and out["kills"] >= 1
    assert out["resumed"] == out["kills"] and out["identical"] == out["kills"], out


def test_async_kills_lose_and_repeat_nothing(tmp_path):
    out = chaos.run_mode("threads", 2, random.Random(1), tmp_path, places=("renamed", "moment"))
    assert out["kills"] >= 1 and out["resumed"] == out["kills"], out
    assert (out["lost_samples"], out["duplicate_samples"], out["staleness_violations"]) == (0, 0, 0), out


def test_samples_waiting_for_their_rewards_survive_kills(tmp_path):
    """Forecasting: the checkpoints hold samples whose questions have not resolved; none is lost or trained
    twice across a SIGKILL and resume."""
    out = chaos.run_mode("delayed", 2, random.Random(2), tmp_path, places=("moment", "synced"))
    assert out["kills"] >= 1 and out["resumed"] == out["kills"] and out["held_samples"] > 0, out
    assert (out["lost_samples"], out["duplicate_samples"], out["staleness_violations"]) == (0, 0, 0), out
