"""Text-to-SQL: the reference query scores 1 and so does a different query with the same result; a query
of the answer's constants passes one table but not both; errors, a second statement and a runaway query
score 0, counted; the model's query never runs on the host; a run trains on the task."""

from __future__ import annotations

import pytest

from schedrl.envs import make_task
from schedrl.envs.text_to_sql import TextToSQLTask, execute

pytestmark = [pytest.mark.sandbox, pytest.mark.usefixtures("sandbox")]


@pytest.fixture
def sandbox():
    from schedrl.sandbox.sandbox import unavailable_reason

    if reason := unavailable_reason():
        pytest.skip(reason)


def scored(source, tasks, queries):
    rewards, metrics, errors = source.reward_batch(tasks, queries, [[]] * len(tasks))
    assert errors == [None] * len(tasks)
    return rewards, metrics


def test_execution_match_not_string_match():
    source = TextToSQLTask()
    tasks = source.sample("train", 40, seed=0)
    rewards, metrics = scored(source, tasks, [t.answer for t in tasks])
    assert rewards == [1.0] * 40 and metrics["sql/error_rate"] == 0.0
    older = next(t for t in tasks if "age>" in t.answer)
    k = int(older.answer.split(">")[1])
    same = [
        f"select name from t where not age <= {k} order by name desc",
        f"SELECT name FROM t WHERE {k}<age",
    ]
    assert scored(source, [older, older], same)[0] == [1.0, 1.0]


def test_constants_pass_one_table_not_both():
    source = TextToSQLTask()
    for task in source.sample("train", 60, seed=1):
        first, second = (execute(task.answer, tab) for tab in task.metadata["tables"])
        if first and sorted(first) != sorted(second):
            break
    constants = " UNION ALL ".join("SELECT " + ", ".join(repr(v) for v in row) for row in first)
    assert scored(source, [task], [constants])[0] == [0.0]


def test_failures_score_zero_and_are_counted():
    source = TextToSQLTask()
    (task,) = source.sample("train", 1, seed=2)
    bad = [
        "SELEC name FROM t",
        f"{task.answer}; DROP TABLE t",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c",
        "SELECT load_extension('/tmp/x')",
    ]
    rewards, metrics = scored(source, [task] * 4, bad)
    assert rewards == [0.0] * 4 and metrics["sql/error_rate"] == 1.0


def test_the_models_query_never_runs_on_the_host(monkeypatch):
    import schedrl.envs.text_to_sql as module

    ran: list[str] = []
    real = module.execute
    monkeypatch.setattr(module, "execute", lambda q, rows: ran.append(q) or real(q, rows))
    source = TextToSQLTask()
    (task,) = source.sample("train", 1, seed=3)
    scored(source, [task], ["SELECT name FROM t WHERE 1=1"])
    assert ran and set(ran) == {task.answer}  # only the reference, ours, on the host


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match=r"task 'text_to_sql': kinds must be an int in \[1, 5\], got 9"):
        make_task("text_to_sql", kinds=9)


@pytest.mark.train
def test_a_run_trains_on_text_to_sql(tmp_path):
    import schedrl
    from schedrl.training.run_dir import read_metrics

    cfg = {
        "steps": 2, "save_every": 0, "out_dir": str(tmp_path), "name": "sql", "sft": {"steps": 20},
        "eval": {"tasks": 4, "k": 1}, "min_start_reward": -1.0, "logging": {"backends": ["jsonl"]},
        "task": {"name": "text_to_sql"}, "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 48},
    }  # fmt: skip
    schedrl.train(cfg)
    rows = [r for r in read_metrics(tmp_path / "sql" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(
        "rewards/sql/error_rate" in r or "sql/error_rate" in r for r in rows
    )
