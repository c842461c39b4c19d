"""Direct preference optimisation on preference pairs (`schedrl dpo DATA --model DIR --out DIR`): the
offline baseline beside RL against a reward model trained on the same pairs.

The policy starts from `model` (a causal LM directory, for example an SFT warm-up's), and a frozen copy of
it is the reference. A pair's side is scored as the summed log-probability of its completion plus the end
of sequence token (TRL appends it too) after its prompt; a prompt too long for `max_length` loses tokens
from its left. The loss is `preferences.dpo_loss` (`sigmoid`, `hinge` or `ipo`, checked against TRL's
`DPOTrainer` on the same batch), in the loop `pair_runs.fit_pairs` shares with `schedrl rm`; held-out
accuracy is the implicit reward's (the chosen side's beta x log-ratio above the rejected side's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from schedrl.rewards.pair_runs import PairConfig, fit_pairs
from schedrl.rewards.preferences import DPO_LOSSES, Pair, dpo_loss
from schedrl.training.batch import collate


@dataclass
class DPOConfig(PairConfig):
    lr: float = 1e-4
    beta: float = 0.1
    loss_type: str = "sigmoid"  # sigmoid | hinge | ipo


def encode_sides(
    tokenizer: Any, pairs: list[Pair], max_length: int
) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, completion ids + eos) for every chosen side, then every rejected side."""
    prompts, completions = [], []
    for side in ("chosen", "rejected"):
        for p in pairs:
            completion = list(tokenizer(getattr(p, side)).input_ids) + [tokenizer.eos_token_id]
            if len(completion) >= max_length:
                raise ValueError(
                    f"pair {p.id!r}: its {side} side is {len(completion)} tokens, max_length is {max_length}"
                )
            prompt = list(tokenizer(p.prompt).input_ids)
            keep = max_length - len(completion)  # the prompt's last tokens that fit
            prompts.append(prompt[-keep:] if len(prompt) > keep else prompt)
            completions.append(completion)
    return prompts, completions


def sequence_logps(
    model: Any, tokenizer: Any, pairs: list[Pair], max_length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed completion log-probs, completion tokens), chosen sides first, then rejected."""
    prompts, completions = encode_sides(tokenizer, pairs, max_length)
    batch = collate(prompts, completions, tokenizer.pad_token_id).to(next(model.parameters()).device)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bfloat16 scored in float32
    per_token = torch.log_softmax(logits, -1).gather(-1, batch.targets[..., None]).squeeze(-1)
    return (per_token * batch.mask).sum(-1), batch.mask.sum(-1)


def pair_loss(policy: Any, reference: Any, tokenizer: Any, pairs: list[Pair], cfg: DPOConfig):
    logps, tokens = sequence_logps(policy, tokenizer, pairs, cfg.max_length)
    with torch.no_grad():
        ref, _ = sequence_logps(reference, tokenizer, pairs, cfg.max_length)
    n = len(pairs)
    return dpo_loss(logps[:n], logps[n:], ref[:n], ref[n:], cfg.beta, cfg.loss_type, tokens[:n], tokens[n:])


def load_policy_pair(path: str) -> tuple[Any, Any, Any]:
    """(the policy, its frozen reference, the tokenizer) from the causal LM directory `path`."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(f"dpo: model {path!r} is not a model directory (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(path)
    for name in ("eos_token_id", "pad_token_id"):
        if getattr(tokenizer, name) is None:
            raise ValueError(f"dpo: model {path!r}: its tokenizer has no {name.removesuffix('_id')} token")
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False)
    return policy, reference, tokenizer


def train_dpo(cfg: DPOConfig, progress: bool = False) -> dict[str, float]:
    """Train (or resume, if `cfg.out` holds checkpoints) and write `cfg.out/model`; the final held-out figures."""
    if cfg.model is None:
        raise ValueError("dpo: model is required (the policy to start from, e.g. an SFT warm-up's directory)")
    if cfg.loss_type not in DPO_LOSSES:
        raise ValueError(f"dpo: loss_type must be one of {', '.join(DPO_LOSSES)}, got {cfg.loss_type!r}")
    if not cfg.beta > 0:
        raise ValueError(f"dpo: beta must be positive, got {cfg.beta!r}")
    torch.manual_seed(cfg.seed)
    policy, reference, tokenizer = load_policy_pair(cfg.model)
    return fit_pairs(
        cfg,
        policy,
        tokenizer,
        lambda pairs: pair_loss(policy, reference, tokenizer, pairs, cfg),
        "dpo",
        progress,
    )
