"""Held-out evaluation: greedy accuracy, pass@1 and pass@k (unbiased), mean reward, lengths."""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedrl.envs import TaskSource
from schedrl.envs.scoring import RewardScorer
from schedrl.rollout import group_requests
from schedrl.seeding import derive_seed
from schedrl.train.metrics import summarize_eval
from schedrl.types import SamplingParams

if TYPE_CHECKING:
    from schedrl.orchestrate.build import Components


def evaluate(
    engine,
    tokenizer,
    source: TaskSource,
    *,
    n_tasks: int,
    k: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
) -> dict[str, float]:
    """Evaluate the engine's current weights on `n_tasks` eval-split tasks drawn with `seed`."""
    if n_tasks == 0:
        return {}
    tasks = source.sample("eval", n_tasks, seed)
    by_id = {t.id: t for t in tasks}
    scorer = RewardScorer(source, max_error_rate=1.0)
    greedy = engine.generate(
        group_requests(
            tasks,
            tokenizer,
            SamplingParams(max_new_tokens, temperature=0),
            1,
            seed=seed,
            step=0,
            tag="eval-greedy",
        )
    )
    greedy_acc = sum(r >= 1.0 for r in scorer(by_id, greedy)) / len(greedy)
    params = SamplingParams(max_new_tokens, temperature=temperature)
    sampled = engine.generate(group_requests(tasks, tokenizer, params, k, seed=seed, step=0, tag="eval"))
    rewards = scorer(by_id, sampled)
    per_task = [rewards[i * k : (i + 1) * k] for i in range(len(tasks))]
    out = summarize_eval(per_task, [s.num_tokens for s in sampled], k)
    return {"greedy_acc": greedy_acc, **out}


def run_eval(c: Components) -> dict[str, float]:
    """The run's held-out evaluation (`eval` section) of `c.engine`'s current weights."""
    e = c.cfg.eval
    return evaluate(
        c.engine,
        c.tokenizer,
        c.source,
        n_tasks=e.tasks,
        k=e.k,
        temperature=e.temperature,
        max_new_tokens=c.cfg.sampling.max_new_tokens,
        seed=derive_seed(c.cfg.seed, "eval"),
    )
