"""User task sets from JSONL, Parquet, a ``datasets.save_to_disk`` directory or rows in memory (a
``datasets.Dataset``, a list of dicts), scored by one or several reward functions.

Each row needs a prompt: a non-empty string, or a list of chat messages (rendered by the
tokenizer's chat template, `schedrl.envs.chat`). answer, id and domain are optional. Every column
but the prompt lands in ``Task.metadata``, so a reward can read them (test cases, a solution); TRL-
shaped rewards get them as keyword lists (`schedrl.envs.reward_funcs`).
"""

from __future__ import annotations

import json
import random
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from schedrl.dotted import load_object
from schedrl.envs.base import RewardFn, Task, check_count, check_split, split_of
from schedrl.envs.chat import check_messages, readable
from schedrl.envs.reward_funcs import RewardFuncs


def load_callable(path: str) -> RewardFn:
    """The reward function named by ``"package.module:function"`` (see `schedrl.dotted.load_object`)."""
    return typing.cast(RewardFn, load_object(path, "reward"))


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield f"line {lineno}", json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {lineno}: invalid JSON: {e.msg}") from e


def _memory_rows(rows: Any) -> Iterator[tuple[str, Any]]:
    """Rows of a `datasets.Dataset` (or anything with `to_list`), or of a list of dicts."""
    items = rows.to_list() if hasattr(rows, "to_list") else list(rows)
    for i, row in enumerate(items):
        yield f"row {i}", row


def _table_rows(path: Path) -> Iterator[tuple[str, Any]]:
    if path.is_dir():
        import datasets

        try:
            ds = datasets.load_from_disk(str(path))
        except (FileNotFoundError, ValueError) as e:
            raise ValueError(f"{path}: not a directory written by datasets save_to_disk: {e}") from e
        if isinstance(ds, datasets.DatasetDict):
            if len(ds) != 1:
                raise ValueError(f"{path}: holds splits {sorted(ds)}; save a single split (a Dataset)")
            ds = next(iter(ds.values()))
        rows = ds.to_list()
    else:
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    for i, row in enumerate(rows):
        yield f"row {i}", row


def _field(where: str, row: dict, name: str, default: str | None, allow_int: bool = False) -> str:
    """The string value of ``row[name]``, or ``default`` when absent/null; ``ValueError`` otherwise."""
    value = row.get(name)
    if value is None and default is not None:
        return default
    if allow_int and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or (default is None and not value):
        need = "a non-empty string" if default is None else "a string"
        raise ValueError(f"{where}: field {name!r} must be {need}, got {value!r:.80}")
    return value


def _rows_of(path: Path) -> Iterator[tuple[str, Any]]:
    if not path.exists():
        raise FileNotFoundError(f"task 'file': no such file or directory: {path}")
    if path.is_dir() or path.suffix == ".parquet":
        return _table_rows(path)
    if path.suffix == ".jsonl":
        return _jsonl_rows(path)
    raise ValueError(f"{path}: unsupported file type; expected .jsonl, .parquet or a datasets dir")


def _reward_funcs(reward: Any, weights: Any) -> RewardFuncs:
    items = reward if isinstance(reward, list | tuple) else [reward]
    for r in items:
        if isinstance(r, str) and r.startswith("<in-memory"):
            raise ValueError(
                f"reward {r}: the run was started by a Trainer with a reward function that is not importable "
                "by name (a lambda, a closure, a function of __main__); continue it with "
                "Trainer(...same objects...).train(resume=RUN_DIR)"
            )
    funcs = [_reward_func(r) for r in items]
    return RewardFuncs(funcs, None if weights is None else [float(w) for w in weights])


def _reward_func(r: Any) -> Any:
    """A callable; a dotted path to one; a reward model: `{reward_model: DIR, ...settings}` or a model
    directory (`schedrl.rewards.RewardModel`); a generative judge: `{judge: DIR, template: ..., ...}`
    (`schedrl.rewards.judge.Judge`)."""
    if callable(r):
        return r
    if isinstance(r, Mapping):
        from schedrl.rewards.mixed import build_scorer

        try:
            return build_scorer(r, "reward_model")
        except ValueError as err:
            raise ValueError(f"reward {dict(r)!r}: {err}") from None
    if isinstance(r, str | Path) and (Path(r) / "config.json").is_file():
        from schedrl.rewards import RewardModel

        return RewardModel(r)
    return load_callable(str(r))


class FileTask:
    """Tasks from a file or from rows in memory, scored by reward functions (`reward`: one, or a list
    with `reward_weights`; each a dotted path or a callable, in TRL's shape or ``fn(task, completion)``).

    With `eval_path` (or `eval_rows`) that set is the eval split and every row of the first is train;
    otherwise the split is a deterministic hash of each task id (``eval_fraction`` of ids are eval).
    ``sample`` draws with replacement. Rewards receive the completion with surrounding whitespace
    stripped.
    """

    name = "file"

    def __init__(
        self,
        path: str | Path | None = None,
        reward: str | RewardFn | list | None = None,
        prompt_field: str = "prompt",
        answer_field: str = "answer",
        id_field: str = "id",
        domain_field: str = "domain",
        eval_fraction: float = 0.1,
        eval_path: str | Path | None = None,
        reward_weights: list[float] | None = None,
        rows: Any = None,
        eval_rows: Any = None,
    ) -> None:
        if isinstance(eval_fraction, bool) or not isinstance(eval_fraction, int | float):
            raise ValueError(f"task 'file': eval_fraction must be a number in [0, 1], got {eval_fraction!r}")
        if not 0.0 <= eval_fraction <= 1.0:
            raise ValueError(f"task 'file': eval_fraction must be in [0, 1], got {eval_fraction!r}")
        if path is None and rows is None:
            raise ValueError("task 'file': missing required argument 'path' (a file; or rows, in memory)")
        if path is not None and rows is not None:
            raise ValueError("task 'file' takes a path or rows, not both")
        if reward is None:
            raise ValueError(
                "task 'file': missing required argument 'reward' (a dotted path, a function, or a list of them)"
            )
        self.path = Path(path) if path is not None else Path("dataset")
        self.eval_fraction = float(eval_fraction)
        self.rewards = _reward_funcs(reward, reward_weights)
        self.fields = {"prompt": prompt_field, "answer": answer_field, "id": id_field, "domain": domain_field}
        train = self._load(_rows_of(self.path) if rows is None else _memory_rows(rows), self.path)
        evals = None
        if eval_path is not None or eval_rows is not None:
            epath = Path(eval_path) if eval_path is not None else Path("eval_dataset")
            evals = self._load(_rows_of(epath) if eval_rows is None else _memory_rows(eval_rows), epath)
        self.tasks = train + (evals or [])
        self.splits: dict[str, list[Task]] = {"train": [], "eval": []}
        if evals is not None:
            self.splits = {"train": train, "eval": evals}
        else:
            for task in train:
                self.splits[split_of(task.id, self.eval_fraction)].append(task)

    def _load(self, rows: Iterator[tuple[str, Any]], path: Path) -> list[Task]:
        f = self.fields
        tasks = []
        for where_short, row in rows:
            where = f"{path} {where_short}"
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
            if f["prompt"] not in row:
                raise ValueError(
                    f"{where}: no {f['prompt']!r} column; the columns are {', '.join(map(repr, row)) or 'none'}"
                )
            default_id = f"{path.stem}-{where_short.replace(' ', '')}"
            raw_prompt = row[f["prompt"]]
            messages = None
            if isinstance(raw_prompt, list):
                messages = check_messages(raw_prompt, where)
                prompt = readable(messages)
            else:
                prompt = _field(where, row, f["prompt"], None)
            tasks.append(
                Task(
                    id=_field(where, row, f["id"], default_id, allow_int=True),
                    prompt=prompt,
                    answer=_field(where, row, f["answer"], ""),
                    domain=_field(where, row, f["domain"], self.name),
                    metadata={k: v for k, v in row.items() if k != f["prompt"]},
                    messages=messages,
                )
            )
        if not tasks:
            raise ValueError(f"{path}: no tasks found")
        return tasks

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        pool = self.splits[check_split(split)]
        if check_count(n) and not pool:
            raise ValueError(
                f"{self.path}: the {split!r} split is empty "
                f"({len(self.tasks)} tasks, eval_fraction={self.eval_fraction})"
            )
        rng = random.Random(seed)
        return [rng.choice(pool) for _ in range(n)]

    def reward(self, task: Task, completion: str) -> float:
        rewards, _, errors = self.reward_batch([task], [completion], [()])
        if errors[0]:
            raise ValueError(errors[0])
        return rewards[0]

    def reward_batch(
        self, tasks: list[Task], completions: list[str], completion_ids: list
    ) -> tuple[list[float], dict[str, float], list[str | None]]:
        """Every reward function over the batch at once (TRL's are batch functions): the weighted rewards,
        per-function metrics, and per sample what raised (see `RewardFuncs.score`)."""
        return self.rewards.score(tasks, [c.strip() for c in completions], completion_ids)

    def solution(self, task: Task) -> str:
        return task.answer
