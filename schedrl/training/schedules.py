"""Learning-rate schedules as factories returning `value(step)`, in the style of optax.

Arguments are checked when the schedule is built, with messages that show the bad value.
"""

from __future__ import annotations

import math
from collections.abc import Callable

Schedule = Callable[[int], float]


def _check(name: str, value: float, *, positive: bool = False) -> None:
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value!r}")


def constant(value: float) -> Schedule:
    """lr(t) = value."""
    _check("value", value)
    return lambda step: value


def linear_warmup(value: float, warmup_steps: int) -> Schedule:
    """lr(t) = value * min(1, (t + 1) / warmup_steps); constant after the warm-up."""
    _check("value", value)
    _check("warmup_steps", warmup_steps)
    if warmup_steps == 0:
        return constant(value)
    return lambda step: value * min(1.0, (step + 1) / warmup_steps)


def cosine_decay(
    value: float, total_steps: int, warmup_steps: int = 0, final_fraction: float = 0.0
) -> Schedule:
    """Linear warm-up, then lr(t) = value * (f + (1 - f) * (1 + cos(pi * p)) / 2), p = decay progress in [0, 1]."""
    _check("value", value)
    _check("total_steps", total_steps, positive=True)
    _check("warmup_steps", warmup_steps)
    if not 0 <= final_fraction <= 1:
        raise ValueError(f"final_fraction must be in [0, 1], got {final_fraction!r}")
    if warmup_steps >= total_steps:
        raise ValueError(f"warmup_steps ({warmup_steps}) must be < total_steps ({total_steps})")
    warm = linear_warmup(value, warmup_steps)

    def schedule(step: int) -> float:
        if step < warmup_steps:
            return warm(step)
        p = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return value * (final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * p)))

    return schedule


def linear_decay(value: float, total_steps: int, warmup_steps: int = 0) -> Schedule:
    """Linear warm-up, then lr(t) = value * (T - t) / (T - w): 0 at t = T (transformers' `linear`)."""
    _check("value", value)
    _check("total_steps", total_steps, positive=True)
    _check("warmup_steps", warmup_steps)
    if warmup_steps >= total_steps:
        raise ValueError(f"warmup_steps ({warmup_steps}) must be < total_steps ({total_steps})")
    warm = linear_warmup(value, warmup_steps)

    def schedule(step: int) -> float:
        if step < warmup_steps:
            return warm(step)
        return value * max(0.0, (total_steps - step) / (total_steps - warmup_steps))

    return schedule


def make_schedule(name: str, lr: float, warmup_steps: int, total_steps: int) -> Schedule:
    if name == "constant":
        return constant(lr)
    if name == "warmup":
        return linear_warmup(lr, warmup_steps)
    if name == "cosine":
        return cosine_decay(lr, total_steps, warmup_steps)
    if name == "linear":
        return linear_decay(lr, total_steps, warmup_steps)
    raise ValueError(f"unknown schedule {name!r}; valid: constant, warmup, cosine, linear")
