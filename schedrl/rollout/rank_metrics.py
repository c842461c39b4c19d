"""Rank agreement between predicted and realised lengths."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def kendall_tau(x: Sequence[float], y: Sequence[float], chunk: int = 1024) -> float:
    """Kendall's tau-b (ties in either sequence handled as scipy.stats.kendalltau does).

    tau_b = (C - D) / sqrt((P - T_x) (P - T_y)), with C/D the concordant/discordant pairs,
    P all pairs and T_x, T_y the pairs tied in x, y. NaN when either sequence is constant.
    """
    if len(x) != len(y):
        raise ValueError(f"kendall_tau: x and y must have equal lengths, got {len(x)} and {len(y)}")
    xs, ys = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    num = nx = ny = 0.0
    for s in range(0, len(xs), chunk):  # (chunk, N) sign blocks keep memory bounded
        dx = torch.sign(xs[s : s + chunk, None] - xs[None, :])
        dy = torch.sign(ys[s : s + chunk, None] - ys[None, :])
        num += float((dx * dy).sum())  # each unordered pair counted twice, as in the denominators
        nx, ny = nx + float((dx != 0).sum()), ny + float((dy != 0).sum())
    if nx == 0 or ny == 0:
        return float("nan")
    return num / math.sqrt(nx * ny)
