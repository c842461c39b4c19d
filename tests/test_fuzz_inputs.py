"""Fuzzed inputs (hypothesis): config values and overrides, dataset rows, reward return values and tool-call
text. Each gives a clear error naming the field, row, line or function, or is handled; never a traceback
from deep inside. 3,100 examples in all, JSONL, Parquet and datasets directories included."""

from __future__ import annotations

import dataclasses
import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedrl.config import ConfigError, RunConfig, config_from_dict, parse_override
from schedrl.envs.base import Task
from schedrl.envs.calc import calc
from schedrl.envs.reward_funcs import RewardFuncs
from schedrl.envs.tools.parsers import PARSERS
from schedrl.envs.tools.schema import make_tool
from schedrl.envs.user import FileTask

FAST = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])


SECTIONS = [f.name for f in dataclasses.fields(RunConfig)]
KEYS = SECTIONS + [
    f"{s}.{f.name}"
    for s in SECTIONS
    if dataclasses.is_dataclass(getattr(RunConfig(), s))
    for f in dataclasses.fields(getattr(RunConfig(), s))
]
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.text(min_size=5000, max_size=6000, alphabet="ab\u00e9\u4e2d\U0001f600"),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


@FAST
@given(key=st.one_of(st.sampled_from(KEYS), st.text(max_size=20)), value=VALUES)
def test_config_values_are_accepted_or_named(key, value):
    data: dict = {}
    node = data
    parts = [p for p in key.split(".") if p] or ["x"]
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    try:
        config_from_dict(data)
    except ConfigError as err:
        assert parts[-1] in str(err) or parts[0] in str(err), (key, str(err))


@FAST
@given(text=st.text(max_size=80))
def test_set_overrides_parse_or_are_named(text):
    try:
        path, _ = parse_override(text)
        config_from_dict({}, [text])
    except ConfigError as err:
        assert "override" in str(err) or "config" in str(err)
    else:
        assert path


ROW_VALUES = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=30),
    st.lists(
        st.dictionaries(st.sampled_from(["role", "content", "x"]), st.text(max_size=8), max_size=3),
        max_size=3,
    ),
    st.floats(allow_nan=True),
)


@FAST
@given(
    rows=st.lists(
        st.dictionaries(st.sampled_from(["prompt", "answer", "id", "domain", "extra"]), ROW_VALUES),
        min_size=1,
        max_size=4,
    )
)
def test_dataset_rows_load_or_name_the_row(rows):
    try:
        task = FileTask(rows=rows, reward=lambda t, c: 0.0)
    except ValueError as err:
        assert "row " in str(err) or "no tasks" in str(err) or "split" in str(err), str(err)
    else:
        assert len(task.tasks) == len(rows)


REWARD_OUTPUTS = st.one_of(
    st.lists(
        st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.booleans()),
        max_size=5,
    ),
    st.none(),
    st.text(max_size=5),
    st.integers(),
)


@FAST
@given(out=REWARD_OUTPUTS)
def test_reward_return_values_are_scored_or_name_the_function(out):
    def fuzzed(completions, **kwargs):
        return out

    tasks = [Task(f"t{i}", "p", "a", "d") for i in range(3)]
    try:
        rewards, _, _ = RewardFuncs([fuzzed]).score(tasks, ["x"] * 3, [[]] * 3)
    except (ValueError, TypeError) as err:
        assert "'fuzzed'" in str(err) or "float" in str(err), str(err)
    else:
        assert len(rewards) == 3 and all(math.isfinite(r) for r in rewards)


CALL_TEXT = st.one_of(
    st.text(max_size=120),
    st.builds(lambda a, b: f"<<calc {a}>>{b}", st.text(max_size=30), st.text(max_size=10)),
    st.builds(lambda a: f"<tool_call>{a}</tool_call>", st.text(max_size=60)),
    st.builds(
        lambda d: f"<tool_call>{json.dumps(d)}</tool_call>",
        st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3),
    ),
)


@settings(max_examples=300, deadline=None)
@given(text=CALL_TEXT, parser=st.sampled_from(sorted(PARSERS.names())))
def test_tool_call_text_parses_into_calls_or_errors(text, parser):
    tools = {"calc": make_tool(calc)}
    for call in PARSERS.get(parser)().parse(text, tools):
        assert call.name is not None or call.error  # an unreadable call carries why


JSONL_LINES = st.lists(
    st.one_of(
        st.text(max_size=40),
        st.builds(
            json.dumps,
            st.dictionaries(st.sampled_from(["prompt", "answer", "id", "x"]), ROW_VALUES, max_size=4),
        ),
        st.builds(json.dumps, st.one_of(st.integers(), st.lists(st.integers(), max_size=2), st.none())),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=JSONL_LINES)
def test_jsonl_files_load_or_name_the_line(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("jsonl") / "rows.jsonl"
    path.write_text("\n".join(line.replace("\n", " ") for line in lines))
    try:
        task = FileTask(path=path, reward=lambda t, c: 0.0)
    except ValueError as err:
        assert str(path) in str(err) and (
            "line " in str(err) or "no tasks" in str(err) or "split" in str(err)
        ), str(err)
    else:
        assert task.tasks


TABLE_ROWS = st.lists(
    st.fixed_dictionaries(
        {
            "prompt": st.one_of(st.none(), st.text(max_size=12)),
            "answer": st.one_of(st.none(), st.text(max_size=4)),
        }
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=TABLE_ROWS, kind=st.sampled_from(["parquet", "datasets"]))
def test_parquet_files_and_datasets_directories_load_or_name_the_row(tmp_path_factory, rows, kind):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp(kind)
    if kind == "parquet":
        path = root / "rows.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path = root / "rows"
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    try:
        task = FileTask(path=path, reward=lambda t, c: 0.0)
    except ValueError as err:
        assert str(path) in str(err) and ("row " in str(err) or "split" in str(err)), str(err)
    else:
        assert len(task.tasks) == len(rows)
