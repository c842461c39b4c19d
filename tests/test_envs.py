"""Contract tests for schedrl.envs: verifiers, hostile inputs, determinism, splits and user files."""

from __future__ import annotations

import builtins
import json
import re
import statistics
import time
from pathlib import Path

import pytest

from schedrl.envs import (
    TASKS,
    AdditionTask,
    CountdownTask,
    FileTask,
    LongtailMix,
    ReverseDigitsTask,
    SortDigitsTask,
    Task,
    TaskSource,
    make_task,
    safe_arith,
)

BUILTINS = ["addition", "sort", "reverse", "countdown", "longtail"]


def _task(prompt: str, answer: str, domain: str) -> Task:
    return Task(id="t", prompt=prompt, answer=answer, domain=domain)


# (source, prompt, answer, completion, expected reward)
VERIFIER_CASES = [
    (AdditionTask(2, 2), "37+45=", "82", "82", 1.0),
    (AdditionTask(2, 2), "37+45=", "82", "  82\n", 1.0),
    (AdditionTask(2, 2), "37+45=", "82", "+82", 1.0),
    (AdditionTask(2, 2), "37+45=", "82", "83", 0.0),
    (AdditionTask(2, 2), "37+45=", "82", "8 2", 0.0),
    (AdditionTask(2, 2), "37+45=", "82", "82x", 0.0),
    (AdditionTask(2, 2), "37+45=", "82", "", 0.0),
    (AdditionTask(2, 2), "37+45=", "82", "-82", 0.0),
    (AdditionTask(2, 2), "37+45=", "82", "８２", 0.0),  # full-width digits are not ASCII
    (AdditionTask(2, 2), "37+45=", "82", "9" * 5000, 0.0),
    (SortDigitsTask(), "sort:3142=", "1234", "1234", 1.0),
    (SortDigitsTask(), "sort:3142=", "1234", " 1234 ", 1.0),
    (SortDigitsTask(), "sort:3142=", "1234", "4321", 0.0),
    (SortDigitsTask(), "sort:3142=", "1234", "123", 0.0),
    (SortDigitsTask(), "sort:3142=", "1234", "1 2 3 4", 0.0),
    (ReverseDigitsTask(), "rev:3142=", "2413", "2413", 1.0),
    (ReverseDigitsTask(), "rev:3142=", "2413", "3142", 0.0),
    (ReverseDigitsTask(), "rev:3142=", "2413", "", 0.0),
    (CountdownTask(), "cd:3,5,7>22=", "3*5+7", "3*5+7", 1.0),
    (CountdownTask(), "cd:3,5,7>22=", "3*5+7", " 7 + 5 * 3 ", 1.0),
    (CountdownTask(), "cd:3,5,7>36=", "(5+7)*3", "(5+7)*3", 1.0),
    (CountdownTask(), "cd:8,4,3>6=", "(8/4)*3", "(8/4)*3", 1.0),
    (CountdownTask(), "cd:8,4,3>6=", "(8/4)*3", "8/4*3", 1.0),
    (CountdownTask(), "cd:3,5,7>15=", "3*5", "3*5", 1.0),  # subsets are allowed
    (CountdownTask(), "cd:3,5,7>22=", "3*5+7", "3*5+7+3-3", 0.0),  # 3 used twice
    (CountdownTask(), "cd:3,5,7>22=", "3*5+7", "2*11", 0.0),  # numbers not given
    (CountdownTask(), "cd:3,5,7>22=", "3*5+7", "3*5-7", 0.0),  # wrong value
    (CountdownTask(), "cd:3,5,7>22=", "3*5+7", "3/(5-5)", 0.0),  # division by zero (and 5 twice)
    (CountdownTask(), "cd:3,5,5>22=", "3*5+7", "3/(5-5)", 0.0),  # division by zero
    (CountdownTask(), "cd:3,5,7>22=", "3*5+7", "3*5+7=22", 0.0),
    (CountdownTask(), "cd:3,5,7>22=", "3*5+7", "", 0.0),
]


@pytest.mark.parametrize(("source", "prompt", "answer", "completion", "expected"), VERIFIER_CASES)
def test_verifiers(source: TaskSource, prompt: str, answer: str, completion: str, expected: float) -> None:
    assert source.reward(_task(prompt, answer, source.name), completion) == expected


def test_longtail_reward_dispatches_by_domain() -> None:
    mix = LongtailMix()
    assert mix.reward(_task("cd:3,5,7>22=", "3*5+7", "countdown"), "7+3*5") == 1.0
    assert mix.reward(_task("rev:3142=", "2413", "reverse_long"), "2413") == 1.0
    assert mix.reward(_task("rev:3142=", "2413", "reverse_long"), "1234") == 0.0
    with pytest.raises(ValueError, match="unknown domain 'nope'"):
        mix.reward(_task("1+1=", "2", "nope"), "2")


HOSTILE = [
    "__import__('os').system('x')",
    "1e9",
    "2**100",
    "(" * 40 + "1" + ")" * 40,
    "1+" * 5000,
    "9" * 50,
    "1--2",
    "-3+4",
    "３",
    "",
    "   ",
    "(1+2",
    "1+2)",
    "()",
    "3 4",
    "1/0",
    "0x10",
    "1_000",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_safe_arith_rejects_hostile_input_without_eval(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("eval/exec/compile must never be called")

    for name in ("eval", "exec", "compile"):
        monkeypatch.setattr(builtins, name, forbidden)
    start = time.perf_counter()
    with pytest.raises(ValueError):
        safe_arith.parse(text)
    task = _task("cd:1,2,3,4,9>3=", "1+2", "countdown")
    assert CountdownTask().reward(task, text) == 0.0
    assert time.perf_counter() - start < 0.1


def test_safe_arith_values_and_literals() -> None:
    # 8/4*3 is (8/4)*3 = 6 (left-assoc); 2+3*4 = 14; 7-(2-1) = 6; 1/3 stays exact.
    assert safe_arith.parse("8/4*3") == (6, [8, 4, 3])
    assert safe_arith.parse("2+3*4") == (14, [2, 3, 4])
    assert safe_arith.parse("7-(2-1)") == (6, [7, 2, 1])
    value, _ = safe_arith.parse("1/3+1/3+1/3")
    assert value == 1
    assert safe_arith.parse("(" * 32 + "1" + ")" * 32)[0] == 1


def test_no_dynamic_evaluation_in_sources() -> None:
    src = Path(safe_arith.__file__).parent
    for path in src.glob("*.py"):
        text = path.read_text()
        # bare builtin calls only: re.compile(...) is fine, compile(...) is not
        assert not re.search(r"(?<![\w.])(eval|exec|compile)\(|literal_eval", text), path.name


@pytest.mark.parametrize("name", BUILTINS)
def test_solution_earns_full_reward(name: str) -> None:
    source = make_task(name)
    assert isinstance(source, TaskSource)
    for split in ("train", "eval"):
        for task in source.sample(split, 200, seed=1):
            assert source.reward(task, source.solution(task)) == 1.0, task
            assert task.prompt.isascii() and task.prompt.isprintable() and task.prompt.endswith("=")
            assert task.answer.isascii() and task.answer.isprintable()


@pytest.mark.parametrize("name", BUILTINS)
def test_sampling_is_deterministic_and_splits_are_disjoint(name: str) -> None:
    source = make_task(name)
    assert source.sample("train", 50, seed=7) == source.sample("train", 50, seed=7)
    assert source.sample("train", 50, seed=7) != source.sample("train", 50, seed=8)
    train = {t.prompt for seed in range(5) for t in source.sample("train", 300, seed=seed)}
    evals = {t.prompt for seed in range(5) for t in source.sample("eval", 300, seed=seed)}
    assert train and evals and not train & evals


def test_ids_are_stable_per_prompt() -> None:
    tasks = AdditionTask(1, 1).sample("train", 500, seed=0)
    ids = {}
    for task in tasks:
        assert ids.setdefault(task.prompt, task.id) == task.id
    assert tasks[0].id.startswith("add-")


@pytest.mark.parametrize("name", BUILTINS)
def test_bad_split_and_count(name: str) -> None:
    source = make_task(name)
    with pytest.raises(ValueError, match="'test'"):
        source.sample("test", 1, seed=0)
    with pytest.raises(ValueError, match="-1"):
        source.sample("train", -1, seed=0)
    assert source.sample("eval", 0, seed=0) == []


def test_longtail_solution_lengths_are_long_tailed() -> None:
    mix = LongtailMix()
    tasks = mix.sample("train", 2000, seed=0)
    lengths = sorted(len(mix.solution(t)) for t in tasks)
    p99 = lengths[int(0.99 * (len(lengths) - 1))]
    assert p99 / statistics.median(lengths) >= 8
    assert {t.domain for t in tasks} == set(mix.components)


def test_countdown_targets_are_positive_integers() -> None:
    for task in CountdownTask().sample("train", 200, seed=3):
        numbers, target = task.metadata["numbers"], task.metadata["target"]
        assert target >= 1 and 3 <= len(numbers) <= 4
        assert task.prompt == f"cd:{','.join(map(str, numbers))}>{target}="


def test_tiny_problem_space_fails_clearly() -> None:
    # The 10 prompts "sort:0=" .. "sort:9=" all hash to train, so the eval split is empty.
    source = SortDigitsTask(1, 1)
    source.max_tries = 200
    assert len(source.sample("train", 5, seed=0)) == 5
    with pytest.raises(ValueError, match="'sort'.*'eval'.*too small"):
        source.sample("eval", 1, seed=0)


def test_make_task_errors() -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown task 'foo'; valid tasks: activity, addition, calc, calendar, countdown, experiments, file",
    ):
        make_task("foo")
    with pytest.raises(ValueError, match=r"'addition'.*min_digits \(3\) must be <= max_digits \(2\)"):
        make_task("addition", min_digits=3, max_digits=2)
    with pytest.raises(ValueError, match=r"'addition'.*min_digits must be an int"):
        make_task("addition", min_digits=0)
    with pytest.raises(ValueError, match=r"'sort'.*unknown argument 'digits'"):
        make_task("sort", digits=3)
    with pytest.raises(ValueError, match=r"'file'.*missing required argument 'path'"):
        make_task("file")
    with pytest.raises(ValueError, match=r"'longtail'.*long_weight"):
        make_task("longtail", long_weight=-1)
    with pytest.raises(ValueError, match=r"'countdown'.*max_number"):
        make_task("countdown", max_number=10**7)
    assert set(TASKS) == {
        "addition",
        "sort",
        "reverse",
        "countdown",
        "longtail",
        "file",
        "tiered",
        "calc",
        "guess",
        "linear_code",
        "math_words",
        "activity",
        "lis",
        "jssp_text",
        "rcpsp",
        "sched_tiered",
        "gym",
        "openenv",
        "verifiers",
        "text_to_sql",
        "swe_repair",
        "forecast",
        "search_qa",
        "tool_plan",
        "calendar",
        "recall",
        "lookup",
        "experiments",
    }


# ---- user files --------------------------------------------------------------------------------

REWARD_MODULE = """
def exact_reward(task, completion):
    return float(completion == task.answer)

not_callable = 3
"""

ROWS = [{"id": f"q{i}", "prompt": f"{i}*2=", "answer": str(2 * i), "source": "unit"} for i in range(40)]


@pytest.fixture
def reward_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    mod_dir = tmp_path / "mods"
    mod_dir.mkdir()
    (mod_dir / "envs_test_rewards.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(mod_dir))
    return "envs_test_rewards:exact_reward"


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _check_file_task(source: FileTask) -> None:
    assert isinstance(source, TaskSource) and source.name == "file"
    assert len(source.tasks) == 40
    train = source.sample("train", 100, seed=0)
    evals = source.sample("eval", 20, seed=0)
    assert train == source.sample("train", 100, seed=0)
    assert not {t.id for t in train} & {t.id for t in evals}
    task = train[0]
    # every column but the prompt reaches the rewards
    assert task.metadata == {"source": "unit", "id": task.id, "answer": task.answer} and task.domain == "file"
    assert source.reward(task, f" {task.answer}\n") == 1.0
    assert source.reward(task, "wrong") == 0.0
    assert source.solution(task) == task.answer


def test_file_task_jsonl(tmp_path: Path, reward_path: str) -> None:
    _check_file_task(FileTask(_write_jsonl(tmp_path / "tasks.jsonl", ROWS), reward=reward_path))


def test_file_task_parquet(tmp_path: Path, reward_path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "tasks.parquet")
    _check_file_task(make_task("file", path=tmp_path / "tasks.parquet", reward=reward_path))


def test_file_task_datasets_dir(tmp_path: Path, reward_path: str) -> None:
    import datasets

    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "tasks_ds"))
    _check_file_task(FileTask(tmp_path / "tasks_ds", reward=reward_path))


def test_file_task_defaults_and_custom_fields(tmp_path: Path) -> None:
    rows = [{"q": f"{i}+0=", "a": str(i), "topic": "math"} for i in range(30)]
    path = _write_jsonl(tmp_path / "custom.jsonl", rows)
    source = FileTask(
        path, "schedrl.envs.base.exact_match", prompt_field="q", answer_field="a", domain_field="topic"
    )
    assert source.tasks[2].id == "custom-line3" and source.tasks[2].domain == "math"
    assert source.reward(source.tasks[2], "2") == 1.0
    only_prompts = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hi"}])
    prompts_only = FileTask(only_prompts, "schedrl.envs:exact_match")
    assert prompts_only.tasks[0].answer == ""


BAD_ROWS = [
    ('{"prompt": "ok"}\n{"prompt": "ok"}\n{"prompt": 42}', "line 3", "'prompt'"),
    ('{"prompt": ""}', "line 1", "'prompt'"),
    ('{"answer": "1"}', "line 1", "'prompt'"),
    ('{"prompt": "ok", "answer": 7}', "line 1", "'answer'"),
    ('{"prompt": "ok"}\n{not json', "line 2", "invalid JSON"),
    ('["prompt"]', "line 1", "JSON object"),
]


@pytest.mark.parametrize(("content", "where", "what"), BAD_ROWS)
def test_file_task_bad_rows(tmp_path: Path, content: str, where: str, what: str) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(content + "\n")
    with pytest.raises(ValueError) as info:
        FileTask(path, "schedrl.envs:exact_match")
    assert "tasks.jsonl" in str(info.value) and where in str(info.value) and what in str(info.value)


def test_file_task_bad_parquet_row(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"prompt": "a"}, {"prompt": None}]), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"bad\.parquet row 1: field 'prompt'"):
        FileTask(tmp_path / "bad.parquet", "schedrl.envs:exact_match")


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("no_such_module_xyz:fn", "cannot import module 'no_such_module_xyz'"),
        ("envs_test_rewards:missing", "has no attribute 'missing'"),
        ("envs_test_rewards.missing", "has no attribute 'missing'"),
        ("envs_test_rewards:not_callable", "not callable"),
        ("justaname", "expected 'package.module:function'"),
    ],
)
def test_file_task_bad_reward_path(tmp_path: Path, reward_path: str, path: str, reason: str) -> None:
    data = _write_jsonl(tmp_path / "tasks.jsonl", ROWS)
    with pytest.raises(ValueError) as info:
        FileTask(data, reward=path)
    assert repr(path) in str(info.value) and reason in str(info.value)


def test_file_task_missing_file_and_bad_type(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        FileTask(tmp_path / "nope.jsonl", "schedrl.envs:exact_match")
    (tmp_path / "t.csv").write_text("prompt\nx\n")
    with pytest.raises(ValueError, match="unsupported file type"):
        FileTask(tmp_path / "t.csv", "schedrl.envs:exact_match")
    with pytest.raises(ValueError, match="eval_fraction"):
        FileTask(tmp_path / "t.csv", "schedrl.envs:exact_match", eval_fraction=1.5)
