"""Preference pairs (a prompt, a chosen and a rejected completion, an optional margin) and the
Bradley-Terry loss a reward model learns them with.

A JSONL file holds one pair a line: `{"prompt": ..., "chosen": ..., "rejected": ..., "margin": 0.5}`
(`margin` optional; an `id` names the pair, else its line). A line without both sides, or with one that
is not text, is an error naming the file and the line. The held-out split is a deterministic hash of each
pair's id, as the file tasks' is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from schedrl.envs.base import split_of


@dataclass(frozen=True)
class Pair:
    id: str
    prompt: str
    chosen: str
    rejected: str
    margin: float = 0.0


def read_pairs(path: str | Path) -> list[Pair]:
    """Every pair of the JSONL file `path` (module doc)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"preference data {str(path)!r} does not exist")
    pairs = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not a JSON object ({err.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: not a JSON object")
        missing = [k for k in ("prompt", "chosen", "rejected") if not isinstance(row.get(k), str)]
        if missing:
            raise ValueError(
                f"{where}: a preference pair needs text fields prompt, chosen and rejected; "
                f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing or not text"
            )
        margin = row.get("margin", 0.0)
        if isinstance(margin, bool) or not isinstance(margin, int | float):
            raise ValueError(f"{where}: margin must be a number, got {margin!r}")
        pairs.append(
            Pair(
                str(row.get("id", f"line-{n}")), row["prompt"], row["chosen"], row["rejected"], float(margin)
            )
        )
    if not pairs:
        raise ValueError(f"preference data {str(path)!r} holds no pairs")
    return pairs


def split_pairs(pairs: list[Pair], eval_fraction: float) -> tuple[list[Pair], list[Pair]]:
    """(train, held-out): each pair by a hash of its id."""
    train = [p for p in pairs if split_of(p.id, eval_fraction) == "train"]
    held = [p for p in pairs if split_of(p.id, eval_fraction) == "eval"]
    return train, held


def bradley_terry_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None, center: float = 0.0
) -> tuple[torch.Tensor, dict[str, float]]:
    """-log sigmoid(r_chosen - r_rejected - margin), the mean over pairs (TRL's `RewardTrainer`), plus
    `center` x mean((r_chosen + r_rejected)^2) (its `center_rewards_coefficient`); and the pair accuracy
    (r_chosen > r_rejected) and the mean score difference."""
    diff = chosen - rejected
    loss = -F.logsigmoid(diff - margin if margin is not None else diff).mean()
    if center:
        loss = loss + center * torch.mean((chosen + rejected) ** 2)
    with torch.no_grad():
        metrics = {"accuracy": float((diff > 0).float().mean()), "margin": float(diff.mean())}
    return loss, metrics


DPO_LOSSES = ("sigmoid", "hinge", "ipo")


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    chosen_tokens: torch.Tensor | None = None,
    rejected_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO's loss, the mean over pairs, on each side's summed completion log-probs under the policy and the
    reference. With d = (chosen - ref_chosen) - (rejected - ref_rejected): `sigmoid` (DPO) is
    -log sigmoid(beta d); `hinge` (SLiC) relu(1 - beta d); `ipo` (1 / 2 beta - d')^2 where d' divides each
    side's log-ratio by its completion's tokens (TRL's normalisation, which IPO's authors confirmed). The
    metrics are TRL's: the implicit rewards beta x log-ratio of each side, their margin and accuracy."""
    if loss_type not in DPO_LOSSES:
        raise ValueError(f"loss_type must be one of {', '.join(DPO_LOSSES)}, got {loss_type!r}")
    if beta <= 0:
        raise ValueError(f"beta must be positive, got {beta!r}")
    chosen_ratio, rejected_ratio = chosen_logps - ref_chosen_logps, rejected_logps - ref_rejected_logps
    delta = chosen_ratio - rejected_ratio
    if loss_type == "sigmoid":
        per_pair = -F.logsigmoid(beta * delta)
    elif loss_type == "hinge":
        per_pair = torch.relu(1 - beta * delta)
    else:
        if chosen_tokens is None or rejected_tokens is None:
            raise ValueError("the ipo loss needs each side's completion token counts")
        d = chosen_ratio / chosen_tokens.clamp(min=1) - rejected_ratio / rejected_tokens.clamp(min=1)
        per_pair = (d - 1 / (2 * beta)) ** 2
    with torch.no_grad():
        chosen_reward, rejected_reward = beta * chosen_ratio, beta * rejected_ratio
        metrics = {
            "accuracy": float((chosen_reward > rejected_reward).float().mean()),
            "rewards/chosen": float(chosen_reward.mean()),
            "rewards/rejected": float(rejected_reward.mean()),
            "rewards/margin": float((chosen_reward - rejected_reward).mean()),
        }
    return per_pair.mean(), metrics
