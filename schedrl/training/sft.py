"""Supervised warm-up on solutions generated from the tasks.

RL from a random model gets no reward signal: GRPO needs a start of roughly 15-30%
success. This fits the model to `prompt -> solution + eos` with cross-entropy on the
completion tokens only, a few dozen steps, before RL begins.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from schedrl.config import SFTConfig
from schedrl.envs import Task, TaskSource
from schedrl.envs.chat import prompt_ids as encode_prompt
from schedrl.seeding import derive_seed
from schedrl.training.batch import collate
from schedrl.training.optimizer import adamw


def sft_batch(source: TaskSource, tokenizer, n: int, seed: int):
    """`n` tasks' prompts and solutions; a source whose episodes open contexts of their own (sub-agents)
    adds each one's transcript through `contexts(task)`, a list of (prompt, completion) pairs."""
    tasks = source.sample("train", n, seed)
    prompts = [encode_prompt(tokenizer, t) for t in tasks]
    answers = [tokenizer(source.solution(t)).input_ids + [tokenizer.eos_token_id] for t in tasks]
    contexts: Callable[[Task], list[tuple[str, str]]] | None = getattr(source, "contexts", None)
    pairs = [pair for t in tasks for pair in contexts(t)] if contexts is not None else []
    for prompt, completion in pairs:
        prompts.append(list(tokenizer(prompt).input_ids))
        answers.append(tokenizer(completion).input_ids + [tokenizer.eos_token_id])
    return collate(prompts, answers, tokenizer.pad_token_id)


def sft_warmup(
    model: torch.nn.Module,
    tokenizer,
    source: TaskSource,
    cfg: SFTConfig,
    seed: int,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Run `cfg.steps` AdamW steps of masked cross-entropy; returns the loss per step."""
    device = next(model.parameters()).device
    model.train()
    optimizer = adamw(model.parameters(), lr=cfg.lr)
    losses = []
    for step in range(cfg.steps):
        batch = sft_batch(source, tokenizer, cfg.batch_size, derive_seed(seed, "sft", step)).to(device)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(
            logits.float().transpose(1, 2), batch.targets, reduction="none"
        )
        loss = (nll * batch.mask).sum() / batch.mask.sum()  # mean over completion tokens, (B, T) -> ()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(step, losses[-1])
    return losses
