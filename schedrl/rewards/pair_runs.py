"""The training loop that learns preference pairs, shared by `schedrl rm` (a reward model) and `schedrl dpo`
(a policy).

Each step takes `batch_size` training pairs in an order fixed by the seed (a new permutation each epoch),
so a resumed run takes the same pairs as the uninterrupted one. Every `eval_every` steps, and at the end,
the held-out pairs' loss and accuracy are logged. The output directory is a run directory as RL runs have
(`config.yaml`, `metrics.jsonl`, `checkpoints/` written by the same crash-consistent protocol);
`DIR/model` is the trained model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from schedrl.rewards.preferences import Pair, read_pairs, split_pairs
from schedrl.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, set_rng_state

# (the pairs of one batch) -> (the loss, its metrics, among them "accuracy")
PairLoss = Callable[[list[Pair]], tuple[torch.Tensor, dict[str, float]]]


@dataclass
class PairConfig:
    data: str  # a JSONL file of preference pairs
    out: str  # the run directory
    model: str | None = None  # the model directory to start from
    steps: int = 300
    batch_size: int = 16
    lr: float = 1e-3
    eval_fraction: float = 0.1
    eval_every: int = 50
    save_every: int = 100
    max_length: int = 256
    seed: int = 0


def batch_at(step: int, n: int, size: int, seed: int) -> list[int]:
    """The pair indices step `step` trains on: consecutive slices of a permutation per epoch."""
    out = []
    start = step * size
    for k in range(start, start + size):
        epoch, i = divmod(k, n)
        out.append(
            int(torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))[i])
        )
    return out


def check_pair_config(cfg: PairConfig, command: str) -> tuple[list[Pair], list[Pair]]:
    """The (training, held-out) pairs, after checking the settings; errors name `command` and the field."""
    for name in ("steps", "batch_size", "eval_every", "save_every", "max_length"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{command}: {name} must be a positive integer, got {value!r}")
    if not 0.0 < cfg.eval_fraction < 1.0:
        raise ValueError(f"{command}: eval_fraction must be in (0, 1), got {cfg.eval_fraction!r}")
    train, held = split_pairs(read_pairs(cfg.data), cfg.eval_fraction)
    if not train or not held:
        raise ValueError(
            f"{command}: {cfg.data!r} splits into {len(train)} training and {len(held)} held-out pairs; "
            "both need some"
        )
    return train, held


def load_weights(model: Any, weights: dict[str, torch.Tensor], where: Path) -> None:
    """Load a checkpoint's weights; only a tied weight (saved once, under its twin's name) may be absent."""
    missing, unexpected = model.load_state_dict(weights, strict=False)
    params = dict(model.named_parameters(remove_duplicate=False))
    untied = [
        k for k in missing if k not in params or not any(params[k] is p for n, p in params.items() if n != k)
    ]
    if unexpected or untied:
        raise ValueError(f"checkpoint {where}: weights missing {untied}, unexpected {unexpected}")


@torch.no_grad()
def evaluate_pairs(model: Any, loss_of: PairLoss, pairs: list[Pair], batch_size: int) -> dict[str, float]:
    """The mean loss and accuracy over `pairs`, in batches, with the model in eval mode."""
    model.eval()
    total, acc, n = 0.0, 0.0, 0
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i : i + batch_size]
        loss, m = loss_of(chunk)
        total += float(loss) * len(chunk)
        acc += m["accuracy"] * len(chunk)
        n += len(chunk)
    model.train()
    return {"eval/loss": total / max(1, n), "eval/accuracy": acc / max(1, n)}


def fit_pairs(
    cfg: PairConfig, model: Any, tokenizer: Any, loss_of: PairLoss, command: str, progress: bool = False
) -> dict[str, float]:
    """Train `model` on `cfg`'s pairs by `loss_of` (or resume, if `cfg.out` holds checkpoints), write
    `cfg.out/model`, and return the final held-out figures."""
    from schedrl.training.run_dir import MetricsLogger, RunDir

    train, held = check_pair_config(cfg, command)
    run = RunDir(Path(cfg.out))
    ckpt = latest_checkpoint(run.ckpt_dir) if run.ckpt_dir.exists() else None
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    start = 0
    if ckpt is not None:
        from safetensors.torch import load_file

        state, trainer_state, rng = load_checkpoint(ckpt)
        load_weights(model, load_file(str(ckpt / "model" / "model.safetensors")), ckpt)
        optimizer.load_state_dict(trainer_state["optimizer"])
        set_rng_state(rng)
        start = int(state["step"])
    run.root.mkdir(parents=True, exist_ok=True)
    run.config_path.write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
    logger = MetricsLogger(run, resume_step=start if ckpt is not None else None, backends=())
    model.train()
    final: dict[str, float] = {}
    steps = range(start, cfg.steps)
    if progress:
        from tqdm import tqdm

        steps = tqdm(steps, desc=command, initial=start, total=cfg.steps)
    for step in steps:
        batch = [train[i] for i in batch_at(step, len(train), cfg.batch_size, cfg.seed)]
        loss, metrics = loss_of(batch)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"{command}: the loss at step {step + 1} is {float(loss)}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        row = {"loss": float(loss), **metrics}
        done = step + 1
        if done % cfg.eval_every == 0 or done == cfg.steps:
            final = evaluate_pairs(model, loss_of, held, cfg.batch_size)
            row.update(final)
        logger.log(done, row)
        if done % cfg.save_every == 0 or done == cfg.steps:
            logger.sync()
            trainer_state = {"optimizer": optimizer.state_dict()}
            save_checkpoint(run.ckpt_dir, done, model, tokenizer, trainer_state, {"pairs": len(train)})
    logger.close()
    model.save_pretrained(run.root / "model")
    tokenizer.save_pretrained(run.root / "model")
    if not final:
        final = evaluate_pairs(model, loss_of, held, cfg.batch_size)
    return {"held_out_pairs": len(held), **final}
