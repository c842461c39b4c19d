"""Evaluation metrics: the unbiased pass@k estimator and a summary of one eval pass.

References: Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (Codex),
arXiv:2107.03374, Sec. 2.1 and Fig. 3.
"""

from __future__ import annotations

import math
from statistics import fmean


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021, Eq. 1).

    pass@k = 1 - C(n-c, k) / C(n, k): the chance that a uniformly drawn k-subset of the n samples
    holds at least one correct one. Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), the numerically
    stable product of the paper's Fig. 3, which never forms the (huge) binomials.
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if value < 0:
            raise ValueError(f"pass_at_k: {name} must be >= 0; got {name}={value}")
    if k < 1:
        raise ValueError(f"pass_at_k: k must be >= 1; got k={k}")
    if k > n:
        raise ValueError(f"pass_at_k: k must be <= n; got k={k} > n={n}")
    if c > n:
        raise ValueError(f"pass_at_k: c must be <= n; got c={c} > n={n}")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def percentile(values: list[float] | list[int], q: float) -> float:
    """The ``q``-th percentile (0 <= q <= 100) by linear interpolation between closest ranks.

    Position (len - 1) * q / 100 in the sorted values, interpolated between its two neighbours; the
    same as numpy's default ``method="linear"``, so p50 is the median.
    """
    if not values:
        raise ValueError("percentile: values is empty")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile: q must be in [0, 100]; got q={q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def summarize_eval(
    rewards_per_task: list[list[float]], lengths: list[int], k: int, threshold: float = 1.0
) -> dict[str, float]:
    """Summary of one eval pass: pass@1, pass@k, mean reward and output-length stats.

    ``rewards_per_task[t]`` holds the rewards of the n_t samples drawn for task t (n_t may differ per
    task, but each must be >= k); a sample is correct when its reward >= ``threshold``. pass@1 and
    pass@k are means over tasks of ``pass_at_k(n_t, c_t, .)``; ``mean_reward`` is the mean over all
    samples. ``lengths`` are output lengths (tokens) of the samples; ``len_p50`` and ``len_p90`` use
    ``percentile`` (linear interpolation).

    Returns keys ``pass@1``, ``pass@{k}``, ``mean_reward``, ``len_mean``, ``len_p50``, ``len_p90``,
    ``len_max``.
    """
    if not rewards_per_task:
        raise ValueError("summarize_eval: rewards_per_task is empty")
    if not lengths:
        raise ValueError("summarize_eval: lengths is empty")
    for t, rewards in enumerate(rewards_per_task):
        if len(rewards) < k:
            raise ValueError(f"summarize_eval: task {t} has n={len(rewards)} samples, fewer than k={k}")
    counts = [(len(rs), sum(r >= threshold for r in rs)) for rs in rewards_per_task]  # (n_t, c_t)
    return {
        "pass@1": fmean(pass_at_k(n, c, 1) for n, c in counts),
        f"pass@{k}": fmean(pass_at_k(n, c, k) for n, c in counts),
        "mean_reward": fmean(r for rs in rewards_per_task for r in rs),
        "len_mean": fmean(lengths),
        "len_p50": percentile(lengths, 50),
        "len_p90": percentile(lengths, 90),
        "len_max": float(max(lengths)),
    }
