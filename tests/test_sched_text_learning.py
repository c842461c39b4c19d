"""The tiny model learns the easiest tier of `activity` and `lis` under GRPO (slow: about a minute each).

pytest -m slow tests/test_sched_text_learning.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schedrl.config import load_config
from schedrl.orchestrate.run import train
from schedrl.training.run_dir import RunDir

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["activity_grpo.yaml", "lis_grpo.yaml"])
def test_held_out_success_rises_by_at_least_0_3(tmp_path, recipe):
    cfg = load_config(EXAMPLES / recipe, ["save_every=0", "logging.backends=[]", f"out_dir={tmp_path}"])
    result = train(cfg, RunDir.create(tmp_path, "run"))
    before, after = result["eval_before"]["pass@1"], result["eval_after"]["pass@1"]
    assert after - before >= 0.3, (before, after)
