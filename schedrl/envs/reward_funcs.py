"""Several reward functions with weights, in TRL's shape or schedrl's, scored as one batch.

Two shapes are accepted, told apart by their parameters:

* TRL's batch shape, ``f(prompts, completions, **columns) -> list[float | None]`` (any function with a
  ``completions`` parameter): it gets the batch's prompts and completions (message lists when the
  prompt was a list of messages, as TRL gives them), ``completion_ids``, and every other dataset
  column as a list, by keyword;
* schedrl's per-sample shape, ``f(task, completion) -> float``.

The reward of a sample is the weighted sum of the functions' values (weights default to 1). As in
TRL, a function that returns ``None`` for a sample does not apply to it: its term is left out of
that sample's sum, and a sample no function applies to scores 0 (counted in ``none_frac``). A
function that returns the wrong number of values is an error naming it and both counts.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from schedrl.envs.base import Task

PROMPT_KEYS = ("prompt", "prompts", "completion", "completions", "completion_ids")


def is_batch_reward(fn: Callable) -> bool:
    """TRL's shape: a `completions` parameter; schedrl's: two positional parameters (task, completion)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "completions" in params


def func_name(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


@dataclass
class RewardFuncs:
    funcs: Sequence[Callable]
    weights: Sequence[float] | None = None
    names: list[str] = field(init=False)
    batch: list[bool] = field(init=False)

    def __post_init__(self) -> None:
        if not self.funcs:
            raise ValueError("reward_funcs is empty: give at least one reward function")
        for fn in self.funcs:
            if not callable(fn):
                raise ValueError(f"reward function {fn!r} is not callable")
        if self.weights is None:
            self.weights = [1.0] * len(self.funcs)
        if len(self.weights) != len(self.funcs):
            raise ValueError(
                f"reward_weights has {len(self.weights)} weights for {len(self.funcs)} reward functions"
            )
        self.names = [func_name(fn) for fn in self.funcs]
        self.batch = [is_batch_reward(fn) for fn in self.funcs]
        for fn, name, batch in zip(self.funcs, self.names, self.batch, strict=True):
            if not batch and len(_positional(fn)) < 2:
                raise ValueError(
                    f"reward function {name!r}: takes neither (prompts, completions, **columns) as TRL's do "
                    f"nor (task, completion) as schedrl's; its parameters are {_positional(fn)}"
                )

    def score(
        self, tasks: Sequence[Task], completions: Sequence[str], completion_ids: Sequence[Sequence[int]]
    ) -> tuple[list[float], dict[str, float], list[str | None]]:
        """(the weighted reward of each sample, metrics: each function's mean over the samples it
        applies to and the fraction of samples no function applied to, and per sample what raised).

        A per-sample function that raises on one sample fails that sample only (it scores 0, and its
        error is returned); a batch function that raises fails the batch (the exception propagates)."""
        n = len(tasks)
        errors: list[str | None] = [None] * n
        values = [self._values(i, tasks, completions, completion_ids, errors) for i in range(len(self.funcs))]
        assert self.weights is not None
        rewards, none = [], 0
        for j in range(n):
            terms = [w * x for w, v in zip(self.weights, values, strict=True) if (x := v[j]) is not None]
            none += not terms
            rewards.append(0.0 if errors[j] else float(sum(terms)))
        metrics = {"reward/none_frac": none / max(1, n)}
        for name, v in zip(self.names, values, strict=True):
            got = [x for x in v if x is not None]
            if got:
                metrics[f"rewards/{name}/mean"] = sum(got) / len(got)
        return rewards, metrics, errors

    def _values(
        self, i: int, tasks, completions, completion_ids, errors: list[str | None]
    ) -> list[float | None]:
        fn, name = self.funcs[i], self.names[i]
        if self.batch[i]:
            out = fn(
                prompts=[prompt_of(t) for t in tasks],
                completions=[completion_of(t, c) for t, c in zip(tasks, completions, strict=True)],
                completion_ids=[list(ids) for ids in completion_ids],
                **columns_of(tasks),
            )
            if not isinstance(out, list | tuple):
                raise ValueError(f"reward function {name!r} returned {type(out).__name__}, not a list")
            if len(out) != len(tasks):
                raise ValueError(
                    f"reward function {name!r} returned {len(out)} values for {len(tasks)} completions"
                )
        else:
            out = []
            for j, (t, c) in enumerate(zip(tasks, completions, strict=True)):
                try:
                    out.append(_checked(fn(t, c), name, t))
                except Exception as err:  # a user's function may raise anything: this sample fails
                    errors[j] = errors[j] or f"task {t.id!r}: {type(err).__name__}: {err}"
                    out.append(None)
            return out
        return [_checked(x, name, t) for x, t in zip(out, tasks, strict=True)]


def _checked(x: Any, name: str, task: Task) -> float | None:
    if x is None:
        return None
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"reward function {name!r} returned {x} for task {task.id!r}")
    return x


def _positional(fn: Callable) -> list[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds]


def prompt_of(task: Task) -> Any:
    """The prompt as the dataset gave it: a message list for chat data, else the string."""
    return [dict(m) for m in task.messages] if task.messages is not None else task.prompt


def completion_of(task: Task, text: str) -> Any:
    """The completion as TRL hands it over: one assistant message in a list after a chat prompt."""
    return [{"role": "assistant", "content": text}] if task.messages is not None else text


def columns_of(tasks: Sequence[Task]) -> dict[str, list[Any]]:
    """Every other column of the tasks' rows, as one list per column (None where a row lacks it)."""
    keys: dict[str, None] = {}
    for t in tasks:
        keys.update(dict.fromkeys(k for k in t.metadata if k not in PROMPT_KEYS and not k.startswith("_")))
    return {k: [t.metadata.get(k) for t in tasks] for k in keys}
