"""Training a reward model on preference pairs: the Bradley-Terry loss in closed form and against TRL's
`RewardTrainer.compute_loss` on the same scores; bad pairs named by file and line; a tiny reward model
learns a hidden rule (prefer the sorted answer) from procedurally generated pairs; a resumed run ends
with the uninterrupted run's weights; the result loads as a reward model."""

from __future__ import annotations

import json
import math
import random
import shutil
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from schedrl.rewards import RewardModel
from schedrl.rewards.pair_runs import batch_at
from schedrl.rewards.preferences import bradley_terry_loss, read_pairs
from schedrl.rewards.train_rm import RMConfig, train_reward_model


def sorted_pairs(path, n: int = 400, seed: int = 0) -> None:
    """Pairs whose chosen answer sorts the prompt's letters and whose rejected one is another order."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        s = "".join(rng.sample("abcdefgh", 4))
        bad = sorted(s)
        while bad == sorted(s):
            rng.shuffle(bad)
        rows.append(
            {"id": f"p{i}", "prompt": f"sort {s}=", "chosen": "".join(sorted(s)), "rejected": "".join(bad)}
        )
    path.write_text("\n".join(json.dumps(r) for r in rows))


def resume_after_crash(whole, cut, last: int, at: int, rerun):
    """Copy the finished run `whole` to `cut` as if it had crashed after step `at`'s checkpoint (before
    step `last`'s), run `rerun()` there, check it ends with `whole`'s weights, and return its result."""
    shutil.copytree(whole, cut)
    shutil.rmtree(cut / "checkpoints" / f"step_{last:06d}")
    shutil.rmtree(cut / "model")
    (cut / "checkpoints" / "latest").write_text(f"step_{at:06d}")
    again = rerun()
    a, b = load_file(whole / "model" / "model.safetensors"), load_file(cut / "model" / "model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)
    return again


def test_the_bradley_terry_loss_in_closed_form():
    chosen, rejected = torch.tensor([2.0, 0.0, -1.0]), torch.tensor([1.0, 0.5, -3.0])
    margin = torch.tensor([0.5, 0.0, 1.0])
    loss, m = bradley_terry_loss(chosen, rejected, margin, center=0.1)
    want = (
        sum(
            math.log1p(math.exp(-(c - r - g)))
            for c, r, g in zip([2, 0, -1], [1, 0.5, -3], [0.5, 0, 1], strict=True)
        )
        / 3
    )
    want += 0.1 * ((2 + 1) ** 2 + 0.5**2 + (-4) ** 2) / 3
    assert float(loss) == pytest.approx(want, abs=1e-6)
    assert m == pytest.approx({"accuracy": 2 / 3, "margin": (1 - 0.5 + 2) / 3})


@pytest.mark.parametrize("with_margin", [True, False])
def test_the_loss_equals_trls_reward_trainer(with_margin):
    pytest.importorskip("trl")
    from trl.trainer.reward_trainer import RewardTrainer

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 1, dtype=torch.float64, generator=g, requires_grad=True)
    margin = torch.rand(4, dtype=torch.float64, generator=g)

    class Accelerator:
        def gather(self, x):
            return x

        def gather_for_metrics(self, x):
            return x

    trainer = SimpleNamespace(
        model=SimpleNamespace(training=True), args=SimpleNamespace(center_rewards_coefficient=0.01),
        accelerator=Accelerator(), _total_train_tokens=0, _tp_size=1, _metrics={"train": defaultdict(list)},
    )  # fmt: skip
    inputs = {"attention_mask": torch.ones(8, 3)}
    if with_margin:
        inputs["margin"] = margin
    trl = RewardTrainer.compute_loss(trainer, lambda **kw: SimpleNamespace(logits=logits), inputs)  # type: ignore[arg-type]
    ours, _ = bradley_terry_loss(logits[:4, 0], logits[4:, 0], margin if with_margin else None, center=0.01)
    torch.testing.assert_close(ours, trl, rtol=0, atol=1e-12)
    (ga,) = torch.autograd.grad(ours, logits)
    (gb,) = torch.autograd.grad(trl, logits)
    torch.testing.assert_close(ga, gb, rtol=0, atol=1e-12)


def test_bad_pairs_are_named_by_file_and_line(tmp_path):
    path = tmp_path / "prefs.jsonl"
    path.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n{"prompt": "p", "chosen": "a"}\n')
    with pytest.raises(
        ValueError, match=r"prefs.jsonl:2: a preference pair needs .* rejected is missing or not text"
    ):
        read_pairs(path)
    path.write_text('{"prompt": "p", "chosen": "a", "rejected": "b", "margin": "big"}\n')
    with pytest.raises(ValueError, match=r"prefs.jsonl:1: margin must be a number, got 'big'"):
        read_pairs(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_pairs(tmp_path / "none.jsonl")


def test_batches_cover_each_epoch_once():
    n, size = 10, 4
    seen = [i for step in range(5) for i in batch_at(step, n, size, seed=3)]  # two epochs
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))


@pytest.mark.train
def test_a_reward_model_learns_a_hidden_rule_and_resumes_exactly(tmp_path):
    torch.set_num_threads(1)
    data = tmp_path / "prefs.jsonl"
    sorted_pairs(data)
    whole = tmp_path / "whole"
    cfg = RMConfig(data=str(data), out=str(whole), steps=120, eval_every=40, save_every=40, lr=3e-3)
    result = train_reward_model(cfg)
    rows = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if "eval/accuracy" in r)
    assert result["eval/accuracy"] >= 0.85, result  # from a start near chance
    assert [r["step"] for r in rows] == list(range(1, 121))
    # crash after step 80's checkpoint: the resumed run ends where the uninterrupted one did
    cut = tmp_path / "cut"
    again = resume_after_crash(
        whole, cut, 120, 80, lambda: train_reward_model(RMConfig(**{**cfg.__dict__, "out": str(cut)}))
    )
    assert again == pytest.approx(result, abs=1e-6)
    assert [json.loads(x)["step"] for x in (cut / "metrics.jsonl").read_text().splitlines()] == list(
        range(1, 121)
    )
    # the result is a reward model: it prefers the sorted answer on pairs it never saw
    rm = RewardModel(whole / "model")
    fresh = tmp_path / "fresh.jsonl"
    sorted_pairs(fresh, n=100, seed=1)
    pairs = read_pairs(fresh)
    good = rm([p.prompt for p in pairs], [p.chosen for p in pairs])
    bad = rm([p.prompt for p in pairs], [p.rejected for p in pairs])
    assert sum(x > y for x, y in zip(good, bad, strict=True)) / len(pairs) >= 0.8
    assert first["eval/accuracy"] <= result["eval/accuracy"]


def test_the_command_line_trains_a_reward_model(tmp_path, capsys):
    from schedrl.cli import main

    data = tmp_path / "prefs.jsonl"
    sorted_pairs(data, n=60)
    assert main(["rm", str(data), "--out", str(tmp_path / "rm"), "--steps", "4", "--batch-size", "4"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["held_out_pairs"] > 0 and 0.0 <= result["eval/accuracy"] <= 1.0
    assert (tmp_path / "rm" / "model" / "config.json").is_file()
    assert (
        main(["rm", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "x")]) == 2
    )  # named, not a traceback
