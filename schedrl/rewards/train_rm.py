"""Train a reward model on preference pairs (`schedrl rm DATA --out DIR`).

A sequence-classification model with one score (a model directory given by `model`, or the tiny preset's
shape with a score head and the char tokenizer) learns the pairs with the Bradley-Terry loss
(`preferences.bradley_terry_loss`; the data's margins with `use_margin`), in the loop `pair_runs.fit_pairs`
shares with DPO (batches fixed by the seed, held-out accuracy, run directory, checkpoints, exact resume).
`DIR/model` is the trained reward model, ready for `task.reward_model.path`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from schedrl.rewards.pair_runs import PairConfig, fit_pairs
from schedrl.rewards.preferences import Pair, bradley_terry_loss


@dataclass
class RMConfig(PairConfig):
    use_margin: bool = True  # subtract each pair's margin inside the loss (TRL's RewardTrainer)
    center: float = 0.0  # TRL's center_rewards_coefficient


def build_model(cfg: RMConfig) -> tuple[Any, Any]:
    """(the model, its tokenizer): from `cfg.model`, or the tiny preset's shape with a score head."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, LlamaForSequenceClassification

    model: Any
    if cfg.model is not None:
        model = AutoModelForSequenceClassification.from_pretrained(cfg.model, num_labels=1)
        tokenizer = AutoTokenizer.from_pretrained(cfg.model)
        if tokenizer.pad_token_id is None:
            raise ValueError(f"model {cfg.model!r}: its tokenizer has no pad token; set one and save it")
    else:
        from schedrl.models import build_char_tokenizer, build_tiny_model

        tokenizer = build_char_tokenizer()
        torch.manual_seed(cfg.seed)
        config = build_tiny_model(tokenizer).config
        config.num_labels = 1
        model = LlamaForSequenceClassification(config)
    model.config.pad_token_id = tokenizer.pad_token_id
    tokenizer.truncation_side, tokenizer.padding_side = "left", "right"
    return model, tokenizer


def scores(model: Any, tokenizer: Any, texts: list[str], max_length: int) -> torch.Tensor:
    enc = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    return model(**enc.to(next(model.parameters()).device)).logits[:, 0].float()


def pair_loss(
    model: Any, tokenizer: Any, pairs: list[Pair], cfg: RMConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    texts = [p.prompt + p.chosen for p in pairs] + [p.prompt + p.rejected for p in pairs]
    r = scores(model, tokenizer, texts, cfg.max_length)
    chosen, rejected = r[: len(pairs)], r[len(pairs) :]
    margin = torch.tensor([p.margin for p in pairs], device=r.device) if cfg.use_margin else None
    return bradley_terry_loss(chosen, rejected, margin, cfg.center)


def train_reward_model(cfg: RMConfig, progress: bool = False) -> dict[str, float]:
    """Train (or resume, if `cfg.out` holds checkpoints) and write `cfg.out/model`; the final held-out figures."""
    model, tokenizer = build_model(cfg)
    return fit_pairs(
        cfg, model, tokenizer, lambda pairs: pair_loss(model, tokenizer, pairs, cfg), "rm", progress
    )
