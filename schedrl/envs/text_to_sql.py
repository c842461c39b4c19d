"""`text_to_sql` (BIRD's task, generated): a question about a small table, answered with one SQLite query,
rewarded by execution match in the sandbox.

Each task has its own table `t(name, age, city)` of 4 to 7 generated rows, and a question of one of five
kinds ("who is older than 31?", "who is younger than 20?", "who lives in oslo?", "how many live in
rome?", "oldest age in lima?"); the prompt is the question, the reference answer a query
(``SELECT name FROM t WHERE age>31``). The model's query runs in the sandbox (its own uid, no network,
rlimits, and a cap on SQLite's virtual-machine steps, so a runaway query is cut and scores 0) on the
task's table and on a second table of the same schema with other rows; it earns 1 when both results
equal the reference query's (as multisets of rows), computed on the host. The second table is the
test-suite check of execution accuracy: a query that returns the answer's constants instead of asking
the table (``SELECT 'ana'``) matches on one table, not on both. Nothing the sandboxed program prints
decides the reward: it reports the rows as data, the host compares them.

A step's queries run in one sandbox run (`reward_batch`), each under the step cap; a query that fails
(a syntax error, a second statement, the cap) scores 0.
"""

from __future__ import annotations

import json
import random
import sqlite3
from collections import Counter
from collections.abc import Sequence
from typing import Any

from schedrl.envs.base import GeneratedTasks, Task, check_int_range, split_of, task_id

NAMES = ("ana", "ben", "cy", "dee", "eli", "fay", "gus", "hal", "ivy", "jo")
CITIES = ("oslo", "rome", "lima", "kyiv")
KINDS = (  # (question, reference query)
    ("who is older than {k}?", "SELECT name FROM t WHERE age>{k}"),
    ("who is younger than {k}?", "SELECT name FROM t WHERE age<{k}"),
    ("who lives in {c}?", "SELECT name FROM t WHERE city='{c}'"),
    ("how many live in {c}?", "SELECT COUNT(*) FROM t WHERE city='{c}'"),
    ("oldest age in {c}?", "SELECT MAX(age) FROM t WHERE city='{c}'"),
)
SCHEMA = "CREATE TABLE t (name TEXT, age INTEGER, city TEXT)"
MAX_STEPS = 100_000  # SQLite virtual-machine steps a query may take (checked every 1,000)
MAX_ROWS = 200
RESULTS = "results.json"
HARNESS = f"""
import json, sqlite3
job = json.load(open("job.json"))
out = []
for query, tables in job:
    got = []
    for rows in tables:
        db = sqlite3.connect(":memory:")
        db.execute({SCHEMA!r})
        db.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
        steps = [0]
        def tick():
            steps[0] += 1000
            return steps[0] > {MAX_STEPS}
        db.set_progress_handler(tick, 1000)
        try:
            got.append(["rows", db.execute(query).fetchmany({MAX_ROWS})])
        except Exception as err:
            got.append(["error", type(err).__name__ + ": " + str(err)[:100]])
        db.close()
    out.append(got)
json.dump(out, open({RESULTS!r}, "w"))
"""


def table(rng: random.Random) -> list[list[Any]]:
    names = rng.sample(NAMES, rng.randint(4, 7))
    return [[n, rng.randint(10, 79), rng.choice(CITIES)] for n in names]


def execute(query: str, rows: Sequence[Sequence[Any]]) -> list[tuple]:
    """The reference query's rows on a table (on the host: the reference is ours, not the model's)."""
    db = sqlite3.connect(":memory:")
    try:
        db.execute(SCHEMA)
        db.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
        return [tuple(r) for r in db.execute(query).fetchall()]
    finally:
        db.close()


def same_rows(a: Sequence[Sequence[Any]], b: Sequence[Sequence[Any]]) -> bool:
    return Counter(map(tuple, a)) == Counter(map(tuple, b))


class TextToSQLTask(GeneratedTasks):
    """A question about a generated table; the model answers with a query (module doc)."""

    name = "text_to_sql"

    def __init__(self, kinds: int = len(KINDS), timeout_s: float = 10.0) -> None:
        self.kinds = check_int_range(self.name, "kinds", kinds, 1, len(KINDS))
        self.timeout_s = timeout_s

    def candidate(self, rng: random.Random) -> Task:
        rows, other = table(rng), table(rng)
        question, query = KINDS[rng.randrange(self.kinds)]
        k, c = rng.randint(15, 75), rng.choice(CITIES)
        prompt = question.format(k=k, c=c) + " sql: "
        gold = query.format(k=k, c=c)
        key = json.dumps([prompt, rows])
        return Task(task_id(self.name, key), prompt, gold, self.name, metadata={"tables": [rows, other]})

    def draw(self, rng: random.Random, split: str) -> Task:
        """Split by the question and its table together (the same question on another table is another task)."""
        for _ in range(self.max_tries):
            task = self.candidate(rng)
            if split_of(task.id) == split:
                return task
        raise ValueError(f"task '{self.name}': no {split!r} problem found in {self.max_tries} tries")

    def reward(self, task: Task, completion: str) -> float:
        rewards, _, errors = self.reward_batch([task], [completion], [[]])
        if errors[0] is not None and errors[0].startswith("sandbox"):
            raise RuntimeError(errors[0])
        return rewards[0]

    def reward_batch(
        self, tasks: Sequence[Task], completions: Sequence[str], completion_ids: Sequence[Sequence[int]]
    ) -> tuple[list[float], dict[str, float], list[str | None]]:
        """Every query of the batch in one sandbox run; 1 where both tables' rows equal the reference's."""
        from schedrl.sandbox.unit_tests import default_pool

        queries = [c.strip().splitlines()[0] if c.strip() else "" for c in completions]
        job = [[q, t.metadata["tables"]] for q, t in zip(queries, tasks, strict=True)]
        result = default_pool().run_sync(code=HARNESS, files={"job.json": json.dumps(job)}, collect=[RESULTS])
        if not result.started:
            message = f"sandbox: the run could not start: {result.stderr[-200:]}"
            return [0.0] * len(tasks), {}, [message] * len(tasks)
        try:
            got = json.loads(result.files.get(RESULTS) or b"null")
        except ValueError:
            got = None
        if not isinstance(got, list) or len(got) != len(tasks):  # killed past its limits: every query 0
            return [0.0] * len(tasks), {"sql/killed": 1.0}, [None] * len(tasks)
        rewards, failed = [], 0
        for task, runs in zip(tasks, got, strict=True):
            ok = isinstance(runs, list) and len(runs) == 2
            for (kind, rows), tab in zip(runs if ok else [], task.metadata["tables"], strict=False):
                ok = (
                    ok
                    and kind == "rows"
                    and isinstance(rows, list)
                    and same_rows(rows, execute(task.answer, tab))
                )
            failed += isinstance(runs, list) and any(r[0] == "error" for r in runs if isinstance(r, list))
            rewards.append(float(ok))
        return (
            rewards,
            {"sql/error_rate": failed / max(1, len(tasks)), "sql/killed": 0.0},
            [None] * len(tasks),
        )
