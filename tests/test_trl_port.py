"""examples/trl_port.py: a TRL GRPOTrainer script with its import and config changed trains and learns."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "trl_port.py"


def test_the_ported_trl_script_raises_reward_and_held_out_accuracy(tmp_path):
    spec = importlib.util.spec_from_file_location("trl_port", EXAMPLE)
    assert spec is not None and spec.loader is not None
    port = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(port)
    summary = port.main(steps=100, out_dir=str(tmp_path))
    # chat messages in, two TRL-shaped rewards with weights: the reward rises, as does held-out pass@1
    assert summary["reward_last_10"] > summary["reward_first_10"] + 0.08, summary
    assert summary["pass@1_after"] > summary["pass@1_before"] + 0.1, summary
    metrics = [
        m
        for m in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
        if "rewards/brief/mean" in m
    ]
    assert metrics, "each reward function's mean is logged"
