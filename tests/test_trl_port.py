"""examples/trl_port.py is a TRL 1.16 GRPO script: it runs on TRL as it is, and on schedrl with only its
import line changed, where it learns."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "trl_port.py"
SCHEDRL_IMPORT = "from schedrl import GRPOConfig, GRPOTrainer"
TRL_IMPORT = "from trl import GRPOConfig, GRPOTrainer"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # TRL pickles nothing here, but dataclasses look modules up by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.train
def test_the_script_differs_from_trl_in_its_import_only_and_runs_on_trl(tmp_path):
    pytest.importorskip("trl")
    source = EXAMPLE.read_text()
    lines = [line for line in source.splitlines() if line.startswith(SCHEDRL_IMPORT)]
    assert len(lines) == 1, "one import line names schedrl's GRPOConfig and GRPOTrainer"
    trl_script = tmp_path / "trl_script.py"
    trl_script.write_text(source.replace(lines[0], TRL_IMPORT))
    out = _load(trl_script, "trl_script").main(steps=2, out_dir=str(tmp_path / "runs"))
    assert type(out["result"]).__name__ == "TrainOutput" and out["result"].global_step == 2
    assert (Path(out["output_dir"]) / "model.safetensors").exists()  # TRL's save_model


@pytest.mark.train
def test_on_schedrl_it_raises_reward_and_held_out_accuracy(tmp_path):
    out = _load(EXAMPLE, "trl_port").main(steps=150, out_dir=str(tmp_path))
    result = out["result"]
    rewards = [m["reward_mean"] for m in result.metrics if "reward_mean" in m]
    assert len(rewards) == 150
    # chat messages in, two TRL-shaped rewards with weights: the reward rises, as does held-out pass@1
    assert sum(rewards[-10:]) / 10 > sum(rewards[:10]) / 10 + 0.08, rewards
    assert result.eval_after["pass@1"] > result.eval_before["pass@1"] + 0.1, result
    assert any("rewards/brief/mean" in m for m in result.metrics), "each reward function's mean is logged"
    assert Path(out["output_dir"]) == result.run_dir
    assert (result.run_dir / "model.safetensors").exists()  # save_model: the trained weights in output_dir
