"""What an engine knows about its waiting requests at admission time, as the rows a learned admission
policy reads: the same function builds the observation of the `schedrl/Admission-v0` environment
(`schedrl.envs.scheduling.admission_env`) and the input of the policy inside the real engine
(`schedrl.rollout.learned`), so a policy trained on one runs on the other unchanged."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

FEATURES = 9


def admission_features(
    predicted: Sequence[float],
    prompts: Sequence[int],
    running_left: Sequence[float],
    slots: int,
    num_waiting: int,
    max_waiting: int,
) -> np.ndarray:
    """One row per offered request (in arrival order, at most `max_waiting`), padded with zero rows.

    Lengths are divided by the longest predicted length in sight (offered or left to run), so the
    features are scale-free: 0 real row, 1 predicted output, 2 prompt, 3 arrival rank, 4 running /
    slots, 5 the longest predicted remainder running, 6 the running batch's predicted remaining work
    per slot, 7 whether this is the longest offered, 8 waiting / (waiting + slots).
    """
    obs = np.zeros((max_waiting, FEATURES), dtype=np.float32)
    k = min(len(predicted), max_waiting)
    if k == 0:
        return obs
    pred = np.asarray(predicted[:k], dtype=np.float64)
    left = np.asarray(running_left, dtype=np.float64)
    scale = max(float(pred.max()), float(left.max()) if left.size else 0.0, 1.0)
    obs[:k, 0] = 1.0
    obs[:k, 1] = pred / scale
    obs[:k, 2] = np.asarray(prompts[:k], dtype=np.float64) / scale
    obs[:k, 3] = np.arange(k) / k
    obs[:k, 4] = left.size / slots
    obs[:k, 5] = (left.max() if left.size else 0.0) / scale
    obs[:k, 6] = left.sum() / (slots * scale)
    obs[:k, 7] = pred >= pred.max()
    obs[:k, 8] = num_waiting / (num_waiting + slots)
    return obs
