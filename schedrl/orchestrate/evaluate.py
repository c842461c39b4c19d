"""Held-out evaluation: greedy accuracy, pass@1 and pass@k (unbiased), mean reward, lengths."""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedrl.envs import TaskSource
from schedrl.envs.scoring import RewardScorer
from schedrl.rollout import group_requests
from schedrl.rollout.episodes import EpisodeRunner
from schedrl.seeding import derive_seed
from schedrl.training.metrics import summarize_eval
from schedrl.types import Request, Sample, SamplingParams

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
    episodes: EpisodeRunner | None = None,
) -> dict[str, float]:
    """Evaluate the engine's current weights on `n_tasks` eval-split tasks drawn with `seed`; with
    `episodes`, each sample is a multi-turn episode scored by its environment."""
    if n_tasks == 0:
        return {}
    tasks = source.sample("eval", n_tasks, seed)
    by_id = {t.id: t for t in tasks}
    scorer = RewardScorer(source, max_error_rate=1.0)

    def play(requests: list[Request]) -> tuple[list[Sample], list[float]]:
        if episodes is None:
            samples = engine.generate(requests)
            return samples, scorer(by_id, samples)
        samples = episodes.run(requests, by_id, alone=True)  # the policy alone, cross-policy or not
        # an episode is judged on its outcome, the last turn's reward, not on shaping rewards before it
        return samples, [s.turn_rewards[-1] if s.turn_rewards else (s.reward or 0.0) for s in samples]

    greedy, greedy_rewards = play(
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
    greedy_acc = sum(r >= 1.0 for r in greedy_rewards) / len(greedy)
    params = SamplingParams(max_new_tokens, temperature=temperature)
    sampled, rewards = play(group_requests(tasks, tokenizer, params, k, seed=seed, step=0, tag="eval"))
    per_task = [rewards[i * k : (i + 1) * k] for i in range(len(tasks))]
    lengths = [s.num_model_tokens for s in sampled]
    out = summarize_eval(per_task, lengths, k)
    return {"greedy_acc": greedy_acc, **out}


def run_eval(c: Components) -> dict[str, float]:
    """The run's held-out evaluation (`eval` section) of `c.engine`'s current weights."""
    e = c.cfg.eval
    return evaluate(
        c.engine,
        c.tokenizer,
        getattr(c.source, "rule_source", c.source),  # a reward model trains; the task's rule judges
        n_tasks=e.tasks,
        k=e.k,
        temperature=e.temperature,
        max_new_tokens=c.cfg.sampling.max_new_tokens,
        seed=derive_seed(c.cfg.seed, "eval"),
        episodes=c.rollout.episodes if c.rollout is not None else None,
    )
