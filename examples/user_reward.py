"""Reward of examples/user_jsonl.yaml: exact match, with partial credit for a near miss.

schedrl calls ``fn(task, completion) -> float`` for every sample, the completion with
surrounding whitespace stripped. ``task`` is a ``schedrl.envs.Task``: ``task.prompt``,
``task.answer``, ``task.id``, ``task.domain``, and ``task.metadata`` (every other column of the
row). A reward that raises scores 0 and is counted; past ``max_reward_error_rate`` the run stops.

Evaluation counts a sample as solved when its reward is >= 1, so partial credit stays below 1.
"""

from __future__ import annotations


def score(task, completion: str) -> float:
    """1.0 for the exact answer; else 0.5 x the share of positions that hold the right character.

    The partial credit gives GRPO a signal before the first exact answers appear: within a group,
    samples closer to the answer get a positive advantage.
    """
    answer = task.answer
    if completion == answer:
        return 1.0
    right = sum(a == b for a, b in zip(completion, answer, strict=False))
    return 0.5 * right / max(len(answer), len(completion), 1)
