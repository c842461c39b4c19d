"""DPO on preference pairs (`schedrl dpo`): each loss in closed form; the loss and its gradient equal TRL's
`DPOTrainer` on the same batch of two real tiny models (TRL computes its own log-probs with its fused head);
a policy learns a hidden preference (prefer the sorted answer) from pairs and resumes exactly; bad settings
are named."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from test_reward_training import resume_after_crash, sorted_pairs

from schedrl.rewards.dpo import DPOConfig, encode_sides, pair_loss, train_dpo
from schedrl.rewards.preferences import Pair, dpo_loss

CHOSEN, REJECTED = torch.tensor([-2.0, -5.0]), torch.tensor([-3.0, -4.0])
REF_CHOSEN, REF_REJECTED = torch.tensor([-2.5, -4.0]), torch.tensor([-2.0, -4.5])


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x))


def test_each_loss_in_closed_form():
    beta = 0.5
    deltas = [(-2 + 2.5) - (-3 + 2.0), (-5 + 4.0) - (-4 + 4.5)]  # 1.5, -1.5
    loss, m = dpo_loss(CHOSEN, REJECTED, REF_CHOSEN, REF_REJECTED, beta, "sigmoid")
    assert float(loss) == pytest.approx(-sum(log_sigmoid(beta * d) for d in deltas) / 2, abs=1e-6)
    assert m["accuracy"] == 0.5 and m["rewards/margin"] == pytest.approx(0.0, abs=1e-6)
    assert m["rewards/chosen"] == pytest.approx(beta * (0.5 - 1.0) / 2)
    loss, _ = dpo_loss(CHOSEN, REJECTED, REF_CHOSEN, REF_REJECTED, beta, "hinge")
    assert float(loss) == pytest.approx((max(0, 1 - 0.75) + max(0, 1 + 0.75)) / 2, abs=1e-6)
    tokens_c, tokens_r = torch.tensor([2.0, 4.0]), torch.tensor([1.0, 5.0])
    loss, _ = dpo_loss(CHOSEN, REJECTED, REF_CHOSEN, REF_REJECTED, beta, "ipo", tokens_c, tokens_r)
    d = [0.5 / 2 - (-1.0) / 1, -1.0 / 4 - 0.5 / 5]
    assert float(loss) == pytest.approx(sum((x - 1 / (2 * beta)) ** 2 for x in d) / 2, abs=1e-6)
    with pytest.raises(ValueError, match="loss_type must be one of sigmoid, hinge, ipo, got 'kto'"):
        dpo_loss(CHOSEN, REJECTED, REF_CHOSEN, REF_REJECTED, beta, "kto")
    with pytest.raises(ValueError, match="token counts"):
        dpo_loss(CHOSEN, REJECTED, REF_CHOSEN, REF_REJECTED, beta, "ipo")


def tiny_pair(seed: int):
    from schedrl.models import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    torch.manual_seed(seed)
    return build_tiny_model(tokenizer), tokenizer


class _Accelerator:
    device = torch.device("cpu")

    def gather(self, x):
        return x

    def gather_for_metrics(self, x):
        return x


@pytest.mark.parametrize("loss_type", ["sigmoid", "hinge", "ipo"])
def test_the_loss_and_its_gradient_equal_trls_dpo_trainer(loss_type):
    pytest.importorskip("trl")
    from trl.trainer.dpo_trainer import DPOTrainer
    from trl.trainer.utils import add_fused_lm_head

    policy, tokenizer = tiny_pair(0)
    reference, _ = tiny_pair(1)
    pairs = [
        Pair("a", "sort:31=", "13", "31"),
        Pair("b", "sort:952=", "259", "25"),
        Pair("c", "sort:7=", "7", "77x"),
    ]
    cfg = DPOConfig(data="-", out="-", beta=0.2, loss_type=loss_type)
    ours, _ = pair_loss(policy, reference, tokenizer, pairs, cfg)
    (ours_grad,) = torch.autograd.grad(ours, policy.model.embed_tokens.weight)

    # TRL's batch: chosen rows then rejected rows, right-padded, a mask on the completion tokens
    prompts, completions = encode_sides(tokenizer, pairs, cfg.max_length)
    width = max(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    attention, completion = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        attention[i, : len(p) + len(c)] = 1
        completion[i, len(p) : len(p) + len(c)] = 1
    add_fused_lm_head(policy, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
    add_fused_lm_head(reference)
    trainer = SimpleNamespace(
        model=policy, ref_model=reference, accelerator=_Accelerator(), aux_loss_enabled=False,
        precompute_ref_logps=False, ld_alpha=None, f_divergence_type="reverse_kl", loss_types=[loss_type],
        loss_weights=[1.0], beta=cfg.beta, label_smoothing=0.0, use_weighting=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)}, _total_train_tokens=0, _tp_size=1,
        args=SimpleNamespace(gradient_checkpointing_kwargs=None),
    )  # fmt: skip
    inputs = {"input_ids": ids, "attention_mask": attention, "completion_mask": completion}
    trl = DPOTrainer._compute_loss(trainer, policy, inputs, return_outputs=False)  # type: ignore[arg-type]
    (trl_grad,) = torch.autograd.grad(trl, policy.model.embed_tokens.weight)
    # TRL's fused head computes in float32 (even for a float64 model): agreement to float32 round-off
    torch.testing.assert_close(ours, trl, rtol=0, atol=1e-6)
    assert float((ours_grad - trl_grad).norm() / trl_grad.norm()) < 1e-5
    assert float(ours) > 0 and ours_grad.abs().sum() > 0


@pytest.mark.train
def test_a_policy_learns_the_preference_and_resumes_exactly(tmp_path):
    from schedrl.models import build_char_tokenizer, build_tiny_model

    torch.set_num_threads(1)
    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    start = tmp_path / "start"
    build_tiny_model(tokenizer).save_pretrained(start)
    tokenizer.save_pretrained(start)
    data = tmp_path / "prefs.jsonl"
    sorted_pairs(data, 300)
    whole = tmp_path / "whole"
    cfg = DPOConfig(
        data=str(data), out=str(whole), model=str(start), steps=60, eval_every=20, save_every=20, lr=1e-3,
        batch_size=8,
    )  # fmt: skip
    result = train_dpo(cfg)
    rows = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if "eval/accuracy" in r)
    assert result["eval/accuracy"] >= 0.9 and first["eval/accuracy"] <= result["eval/accuracy"], result
    # crash after step 40's checkpoint: the resumed run ends where the uninterrupted one did
    cut = tmp_path / "cut"
    again = resume_after_crash(
        whole, cut, 60, 40, lambda: train_dpo(DPOConfig(**{**cfg.__dict__, "out": str(cut)}))
    )
    assert again == pytest.approx(result, abs=1e-6)


def test_bad_settings_are_named(tmp_path):
    data = tmp_path / "prefs.jsonl"
    sorted_pairs(data, 20)
    with pytest.raises(ValueError, match="dpo: model is required"):
        train_dpo(DPOConfig(data=str(data), out=str(tmp_path / "o")))
    with pytest.raises(FileNotFoundError, match="not a model directory"):
        train_dpo(DPOConfig(data=str(data), out=str(tmp_path / "o"), model=str(tmp_path)))
    with pytest.raises(ValueError, match="dpo: beta must be positive, got 0.0"):
        train_dpo(DPOConfig(data=str(data), out=str(tmp_path / "o"), model=str(tmp_path), beta=0.0))
    with pytest.raises(ValueError, match="dpo: loss_type must be one of sigmoid, hinge, ipo, got 'kto'"):
        train_dpo(DPOConfig(data=str(data), out=str(tmp_path / "o"), model=str(tmp_path), loss_type="kto"))


def test_the_command_line_runs_dpo(tmp_path, capsys):
    from schedrl.cli import main
    from schedrl.models import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(tmp_path / "start")
    tokenizer.save_pretrained(tmp_path / "start")
    data = tmp_path / "prefs.jsonl"
    sorted_pairs(data, 60)
    argv = [
        "dpo",
        str(data),
        "--model",
        str(tmp_path / "start"),
        "--out",
        str(tmp_path / "dpo"),
        "--steps",
        "3",
    ]
    assert main([*argv, "--batch-size", "4", "--loss-type", "ipo"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["held_out_pairs"] > 0 and 0.0 <= result["eval/accuracy"] <= 1.0
    assert (tmp_path / "dpo" / "model" / "config.json").is_file()
    assert main(["dpo", str(data), "--out", str(tmp_path / "x")]) == 2  # no --model: named, not a traceback
