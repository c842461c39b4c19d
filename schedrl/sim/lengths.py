"""Output lengths of the samples of one RL step: per prompt group, heavy-tailed and capped.

Each group of `group_size` samples shares a prompt, so its lengths are correlated: a group draws a
factor exp(N(0, group_sigma)) and every sample multiplies its own draw by it. The kinds:

    lognormal   median x exp(N(0, sigma))                 (sigma: the within-group spread)
    pareto      min x (1 + Lomax(alpha))                  (alpha > 1 for a finite mean)
    fixed       median                                    (every sample the same)
    empirical   resampled from `values` or a file of lengths (one integer per line, or a run's
                `samples.jsonl` rows with `num_tokens`); with `per_group`, once per group, each
                sample that draw x exp(N(0, sigma)); with `rho`, a Gaussian copula: each sample's
                quantile of `values` from rho x its group's normal draw + sqrt(1 - rho^2) x its
                own, so the lengths keep exactly the distribution of `values` and a group's
                samples correlate (rho^2 of the spread of their normal scores is between groups)

Every draw is rounded and clipped to [1, cap]: the response cap of the run.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_erf = np.vectorize(math.erf, otypes=[float])

KINDS = ("lognormal", "pareto", "fixed", "empirical")


class DistributionError(ValueError):
    """A length distribution that cannot be sampled; the message names it."""


@dataclass
class LengthDist:
    kind: str = "lognormal"  # the distribution: one of KINDS (lognormal, pareto, fixed, empirical)
    median: float = 512.0  # lognormal, fixed: the median length in tokens
    sigma: float = 1.0  # lognormal: the spread of log length within a group
    alpha: float = 1.5  # pareto: the tail index
    min: float = 64.0  # pareto: the smallest length
    cap: int = 4096  # the response cap: no sample is longer
    group_sigma: float = 0.0  # the spread of log length between prompt groups
    values: tuple[int, ...] = ()  # empirical: the lengths to resample
    path: str | None = None  # empirical: a file of lengths (read once)
    # empirical: one draw per group, each sample that draw x exp(N(0, sigma)) (a task sets the length)
    per_group: bool = False
    rho: float | None = None  # empirical: the copula's correlation within a group (keeps `values`' spread)

    def check(self, where: str = "lengths") -> None:
        def bad(key: str, why: str) -> DistributionError:
            return DistributionError(f"{where}.{key}: {why} (distribution {self.kind!r})")

        if self.kind not in KINDS:
            raise DistributionError(
                f"{where}.kind: unknown distribution {self.kind!r}; valid: {', '.join(KINDS)}"
            )
        if self.cap < 1:
            raise bad("cap", f"must be >= 1, got {self.cap!r}")
        if self.group_sigma < 0 or self.sigma < 0:
            raise bad("sigma" if self.sigma < 0 else "group_sigma", "must be >= 0")
        if self.kind in ("lognormal", "fixed") and not self.median > 0:
            raise bad("median", f"must be > 0, got {self.median!r}")
        if self.kind == "pareto" and not (self.alpha > 0 and self.min > 0):
            raise bad("alpha" if self.alpha <= 0 else "min", "must be > 0")
        if self.rho is not None and not (self.kind == "empirical" and 0.0 <= self.rho <= 1.0):
            raise bad("rho", f"must be within [0, 1], for an empirical distribution only, got {self.rho!r}")
        if self.kind == "empirical":
            if self.path is not None and not self.values:
                self.values = tuple(read_lengths(self.path, where))
            if not self.values:
                raise bad(
                    "values", "an empirical distribution needs values or a path with at least one length"
                )
            if min(self.values) < 1:
                raise bad("values", f"lengths must be >= 1, got {min(self.values)!r}")

    def sample(self, rng: np.random.Generator, groups: int, group_size: int) -> np.ndarray:
        """(groups, group_size) integer lengths in [1, cap]."""
        shape = (groups, group_size)
        if self.kind == "lognormal":
            x = self.median * np.exp(rng.normal(0.0, self.sigma, shape))
        elif self.kind == "pareto":
            x = self.min * (1.0 + rng.pareto(self.alpha, shape))
        elif self.kind == "fixed":
            x = np.full(shape, float(self.median))
        elif self.rho is not None:
            v = np.sort(np.asarray(self.values, dtype=float))
            z = self.rho * rng.standard_normal((groups, 1))
            z = z + math.sqrt(1.0 - self.rho**2) * rng.standard_normal(shape)
            u = 0.5 * (1.0 + _erf(z / math.sqrt(2.0)))
            x = v[np.minimum((u * len(v)).astype(np.int64), len(v) - 1)]
        elif self.per_group:
            base = rng.choice(np.asarray(self.values, dtype=float), (groups, 1))
            x = base * np.exp(rng.normal(0.0, self.sigma, shape))
        else:
            x = rng.choice(np.asarray(self.values, dtype=float), shape)
        if self.group_sigma > 0:
            x = x * np.exp(rng.normal(0.0, self.group_sigma, (groups, 1)))
        return np.clip(np.rint(x), 1, self.cap).astype(np.int64)

    def mean(self, rng: np.random.Generator | None = None, n: int = 20_000) -> float:
        """The mean sampled length (by sampling: the cap makes closed forms piecewise)."""
        return float(self.sample(rng or np.random.default_rng(0), n // 16 or 1, 16).mean())


def read_lengths(path: str | Path, where: str = "lengths") -> list[int]:
    """Lengths from a file: one integer per line, or JSONL rows with `num_tokens` (a run's samples)."""
    p = Path(path)
    if not p.is_file():
        raise DistributionError(f"{where}.path: no such file {str(p)!r}")
    out: list[int] = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
            out.append(int(value["num_tokens"] if isinstance(value, dict) else value))
        except (ValueError, KeyError, TypeError):
            raise DistributionError(
                f"{where}.path: {str(p)!r} line {n} is neither a length nor a row with num_tokens: {line[:60]!r}"
            ) from None
    return out
