"""Episode traces: trace events in closed form; a multi-turn run (synchronous, and asynchronous on
threads) records each episode's reset, model turns and steps in order, exported with the workers' spans
as a trace-event JSON that the report links, each turn holding its request's engine phases;
`logging.episode_trace: false` records none."""

from __future__ import annotations

import json

import pytest

from schedrl.timeline import EPISODES_FILE, Span, engine_phases
from schedrl.trace_export import TRACE_FILE, trace_events, write_trace
from schedrl.types import Timings


def test_trace_events_in_closed_form():
    workers = [Span("engine", "decode", 10.0, 10.5), Span("learner", "train", 10.25, 11.0)]
    episodes = [
        Span("engine", "env", 10.0, 10.1, "ep-b", "reset"),
        Span("engine", "turn", 10.1, 10.3, "ep-b", "turn 0 (4 tokens)"),
        Span("engine", "env", 10.05, 10.2, "ep-a", "step ok"),
    ]
    events = trace_events(workers, episodes)
    meta = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M"}
    assert meta == {(1, 0): "engine", (2, 0): "learner", (3, 0): "episodes", (3, 1): "ep-a", (3, 2): "ep-b"}
    complete = [
        (e["name"], e["cat"], e["pid"], e["tid"], e["ts"], e["dur"]) for e in events if e["ph"] == "X"
    ]
    assert complete == [
        ("decode", "decode", 1, 0, 0.0, 500000.0),
        ("train", "train", 2, 0, 250000.0, 750000.0),
        ("reset", "env", 3, 2, 0.0, 100000.0),
        ("step ok", "env", 3, 1, 50000.0, 150000.0),
        ("turn 0 (4 tokens)", "turn", 3, 2, 100000.0, 200000.0),
    ]
    assert trace_events([], []) == []


def test_engine_phases_fall_inside_the_turn_in_closed_form():
    # the engine's clock starts elsewhere: its `finished` lands at the turn's end (110.0)
    t = Timings(arrival=5.0, admitted=5.25, first_token=5.5, finished=6.0)
    assert engine_phases(t, 109.0, 110.0) == [("queued", 109.0, 109.25), ("prefill", 109.25, 109.5),
                                              ("decode", 109.5, 110.0)]  # fmt: skip
    # a turn span shorter than the engine's stamps: the phases are clipped into it
    assert engine_phases(t, 109.4, 110.0) == [("prefill", 109.4, 109.5), ("decode", 109.5, 110.0)]
    # admitted at arrival (no queue), never stamped, or not finished
    assert [k for k, *_ in engine_phases(Timings(1.0, 1.0, 1.5, 2.0), 0.0, 9.0)] == ["prefill", "decode"]
    assert engine_phases(Timings(1.0, None, None, 2.0), 0.0, 9.0) == []
    assert engine_phases(Timings(1.0, 1.5, None, None), 0.0, 9.0) == []


def test_a_turn_comes_before_the_phases_it_holds():
    episodes = [Span("e", "queued", 1.0, 1.5, "ep", "queued"), Span("e", "turn", 1.0, 2.0, "ep", "turn 0")]
    cats = [e["cat"] for e in trace_events([], episodes) if e["ph"] == "X"]
    assert cats == ["turn", "queued"]


def run_tools(tmp_path, name: str, **extra):
    import schedrl

    cfg = {
        "steps": 2, "save_every": 0, "out_dir": str(tmp_path), "name": name, "sft": {"steps": 10},
        "eval": {"tasks": 0}, "min_start_reward": -1.0, "logging": {"backends": ["jsonl"]},
        "task": {"name": "calc", "args": {"min_digits": 2, "max_digits": 2}, "env": "tools",
                 "env_args": {"tools": ["schedrl.envs.calc:calc"]}, "max_turns": 3},
        "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 24},
        **extra,
    }  # fmt: skip
    schedrl.train(cfg)
    return tmp_path / name


@pytest.mark.train
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_multi_turn_run_traces_each_episode_in_order(tmp_path, mode):
    from schedrl.run_report import write_run_report

    extra = {"pipeline": {"mode": "async", "backend": "threads"}} if mode == "async" else {}
    run = run_tools(tmp_path, mode, **extra)
    assert (run / EPISODES_FILE).is_file()
    page = write_run_report(run).read_text()
    assert f"<a href='{TRACE_FILE}'>" in page
    trace = json.loads((run / TRACE_FILE).read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    processes = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert "episodes" in processes and ("engine" in processes if mode == "async" else "trainer" in processes)
    tracks: dict[int, list[dict]] = {}
    for e in events:
        if e["cat"] in ("env", "turn"):
            tracks.setdefault(e["tid"], []).append(e)
    assert len(tracks) >= 8  # 2 steps x 4 episodes (async may have started more)
    for evs in tracks.values():
        evs.sort(key=lambda e: e["ts"])
        kinds = [e["cat"] for e in evs]
        assert evs[0]["name"] == "reset" and kinds[1::2] == ["turn"] * len(kinds[1::2])
        assert all(k == "env" for k in kinds[0::2])  # reset, turn, step, turn, step ...
        for a, b in zip(evs, evs[1:], strict=False):
            assert a["ts"] + a["dur"] <= b["ts"] + 1.0  # one thing at a time per episode (1 us slack)
    phases = [e for e in events if e["cat"] in ("queued", "prefill", "decode") and "episode" in e["args"]]
    turns = [e for e in events if e["cat"] == "turn"]
    assert {e["cat"] for e in phases} >= {"prefill", "decode"}
    for p in phases:  # each phase inside a turn of its own episode
        assert any(t["tid"] == p["tid"] and t["ts"] <= p["ts"] and p["ts"] + p["dur"] <= t["ts"] + t["dur"] + 1.0
                   for t in turns)  # fmt: skip
    assert sum(p["dur"] for p in phases if p["cat"] == "decode") > 0


@pytest.mark.train
def test_episode_traces_can_be_turned_off(tmp_path):
    run = run_tools(tmp_path, "off", logging={"backends": ["jsonl"], "episode_trace": False})
    assert not (run / EPISODES_FILE).exists()
    trace = write_trace(run)
    assert trace is not None
    names = {e["args"]["name"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "M"}
    assert "episodes" not in names
