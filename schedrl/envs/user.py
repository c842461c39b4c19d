"""User task sets from JSONL, Parquet or a ``datasets.save_to_disk`` directory, scored by dotted-path reward.

Each row needs a non-empty string prompt; answer, id and domain are optional. Columns other
than these four land in ``Task.metadata`` so a custom reward can read them (e.g. test cases).
"""

from __future__ import annotations

import json
import math
import random
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from schedrl.dotted import load_object
from schedrl.envs.base import RewardFn, Task, check_count, check_split, split_of


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


class FileTask:
    """Tasks loaded from a file, scored by a user function ``fn(task, completion) -> float``.

    Splits are a deterministic hash of each task id (``eval_fraction`` of ids are eval);
    ``sample`` draws with replacement. The reward function receives the completion with
    surrounding whitespace stripped.
    """

    name = "file"

    def __init__(
        self,
        path: str | Path,
        reward: str | RewardFn,
        prompt_field: str = "prompt",
        answer_field: str = "answer",
        id_field: str = "id",
        domain_field: str = "domain",
        eval_fraction: float = 0.1,
    ) -> None:
        if isinstance(eval_fraction, bool) or not isinstance(eval_fraction, int | float):
            raise ValueError(f"task 'file': eval_fraction must be a number in [0, 1], got {eval_fraction!r}")
        if not 0.0 <= eval_fraction <= 1.0:
            raise ValueError(f"task 'file': eval_fraction must be in [0, 1], got {eval_fraction!r}")
        self.path = Path(path)
        self.eval_fraction = float(eval_fraction)
        self.reward_fn: RewardFn = reward if callable(reward) else load_callable(reward)
        self.fields = {"prompt": prompt_field, "answer": answer_field, "id": id_field, "domain": domain_field}
        self.tasks = self._load()
        self.splits: dict[str, list[Task]] = {"train": [], "eval": []}
        for task in self.tasks:
            self.splits[split_of(task.id, self.eval_fraction)].append(task)

    def _rows(self) -> Iterator[tuple[str, Any]]:
        if not self.path.exists():
            raise FileNotFoundError(f"task 'file': no such file or directory: {self.path}")
        if self.path.is_dir() or self.path.suffix == ".parquet":
            return _table_rows(self.path)
        if self.path.suffix == ".jsonl":
            return _jsonl_rows(self.path)
        raise ValueError(f"{self.path}: unsupported file type; expected .jsonl, .parquet or a datasets dir")

    def _load(self) -> list[Task]:
        f = self.fields
        tasks = []
        for where_short, row in self._rows():
            where = f"{self.path} {where_short}"
            if not isinstance(row, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
            default_id = f"{self.path.stem}-{where_short.replace(' ', '')}"
            tasks.append(
                Task(
                    id=_field(where, row, f["id"], default_id, allow_int=True),
                    prompt=_field(where, row, f["prompt"], None),
                    answer=_field(where, row, f["answer"], ""),
                    domain=_field(where, row, f["domain"], self.name),
                    metadata={k: v for k, v in row.items() if k not in f.values()},
                )
            )
        if not tasks:
            raise ValueError(f"{self.path}: no tasks found")
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
        value = float(self.reward_fn(task, completion.strip()))
        if not math.isfinite(value):
            raise ValueError(f"task 'file': reward function returned {value} for task {task.id!r}")
        return value

    def solution(self, task: Task) -> str:
        return task.answer
