"""Train a reward model on preference pairs (`schedrl rm DATA --out DIR`).

A sequence-classification model with one score (a model directory given by `model`, or the tiny preset's
shape with a score head and the char tokenizer) learns the pairs with the Bradley-Terry loss
(`preferences.bradley_terry_loss`; the data's margins with `use_margin`). Each step takes `batch_size`
pairs in an order fixed by the seed (a new permutation each epoch), so a resumed run takes the same pairs
as the uninterrupted one. Every `eval_every` steps, and at the end, the held-out pairs' accuracy and
loss are logged. `DIR` is a run directory as RL runs have (`config.yaml`, `metrics.jsonl`,
`checkpoints/` written by the same crash-consistent protocol); `DIR/model` is the trained reward model,
ready for `task.reward_model.path`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from schedrl.rewards.preferences import Pair, bradley_terry_loss, read_pairs, split_pairs
from schedrl.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, set_rng_state


@dataclass
class RMConfig:
    data: str  # a JSONL file of preference pairs
    out: str  # the run directory
    model: str | None = None  # a model directory to start from; None: the tiny preset with a score head
    steps: int = 300
    batch_size: int = 16
    lr: float = 1e-3
    use_margin: bool = True  # subtract each pair's margin inside the loss (TRL's RewardTrainer)
    center: float = 0.0  # TRL's center_rewards_coefficient
    eval_fraction: float = 0.1
    eval_every: int = 50
    save_every: int = 100
    max_length: int = 256
    seed: int = 0


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


@torch.no_grad()
def evaluate(model: Any, tokenizer: Any, pairs: list[Pair], cfg: RMConfig) -> dict[str, float]:
    model.eval()
    total, acc, n = 0.0, 0.0, 0
    for i in range(0, len(pairs), cfg.batch_size):
        chunk = pairs[i : i + cfg.batch_size]
        loss, m = pair_loss(model, tokenizer, chunk, cfg)
        total += float(loss) * len(chunk)
        acc += m["accuracy"] * len(chunk)
        n += len(chunk)
    model.train()
    return {"eval/loss": total / max(1, n), "eval/accuracy": acc / max(1, n)}


def train_reward_model(cfg: RMConfig, progress: bool = False) -> dict[str, float]:
    """Train (or resume, if `cfg.out` holds checkpoints) and write `cfg.out/model`; the final held-out figures."""
    from schedrl.training.run_dir import MetricsLogger, RunDir

    for name in ("steps", "batch_size", "eval_every", "save_every", "max_length"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"rm: {name} must be a positive integer, got {value!r}")
    if not 0.0 < cfg.eval_fraction < 1.0:
        raise ValueError(f"rm: eval_fraction must be in (0, 1), got {cfg.eval_fraction!r}")
    pairs = read_pairs(cfg.data)
    train, held = split_pairs(pairs, cfg.eval_fraction)
    if not train or not held:
        raise ValueError(
            f"rm: {cfg.data!r} splits into {len(train)} training and {len(held)} held-out pairs; both need some"
        )
    run = RunDir(Path(cfg.out))
    ckpt = latest_checkpoint(run.ckpt_dir) if run.ckpt_dir.exists() else None
    model, tokenizer = build_model(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    start = 0
    if ckpt is not None:
        from safetensors.torch import load_file

        state, trainer_state, rng = load_checkpoint(ckpt)
        model.load_state_dict(load_file(str(ckpt / "model" / "model.safetensors")))
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

        steps = tqdm(steps, desc="reward model", initial=start, total=cfg.steps)
    for step in steps:
        batch = [train[i] for i in batch_at(step, len(train), cfg.batch_size, cfg.seed)]
        loss, metrics = pair_loss(model, tokenizer, batch, cfg)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"rm: the loss at step {step + 1} is {float(loss)}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        row = {"loss": float(loss), **metrics}
        done = step + 1
        if done % cfg.eval_every == 0 or done == cfg.steps:
            final = evaluate(model, tokenizer, held, cfg)
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
        final = evaluate(model, tokenizer, held, cfg)
    return {"held_out_pairs": len(held), **final}
