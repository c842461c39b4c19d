"""The `Schedule` record: one type for a run and a scenario, each policy checked by its own `Args`, the
rules between policies named by the policies that own them, and old keys migrated."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

import schedrl
from schedrl.api import resolve_config
from schedrl.config import ConfigError, Schedule, config_from_dict, load_config
from schedrl.orchestrate.consumption.wave import Wave
from schedrl.orchestrate.schedule import POLICIES, make_bound, make_consumption
from schedrl.orchestrate.staleness import AutoStaleness, StalenessBound
from schedrl.sim.scenario import Scenario, scenario_from_dict


class EveryGroup(Wave):
    """A user's consumption policy, named by dotted path: a wave, taken as soon as any group is complete."""

    def take(self, queue):
        done = [g for g in queue if g.admitted and g.complete]
        return done or None


class EngineWithoutPreemption:
    """An engine backend that parks but cannot suspend a running request."""

    features = frozenset({"park"})
    check = staticmethod(lambda settings: None)


class EngineWithoutParking:
    """An engine backend that can suspend a running request but keeps nothing for a continuation."""

    features = frozenset({"preempt"})
    check = staticmethod(lambda settings: None)


def test_a_run_and_a_scenario_hold_the_same_schedule_type():
    run = {f.name: f.type for f in dataclasses.fields(schedrl.config.RunConfig)}
    scenario = {f.name: f.type for f in dataclasses.fields(Scenario)}
    assert run["schedule"] == scenario["schedule"] == "Schedule"
    s = scenario_from_dict({"schedule": {"max_staleness": 2, "consumption": "partial"}})
    assert isinstance(s.schedule, Schedule) and s.schedule.k_bound == 2


@pytest.mark.parametrize("field", sorted(POLICIES))
def test_an_unregistered_name_lists_the_registered_ones(field):
    with pytest.raises(ConfigError) as err:
        resolve_config({"schedule": {field: "nope"}})
    message = str(err.value)
    assert f"schedule.{field}" in message and "'nope'" in message
    assert all(name in message for name in POLICIES[field].names())


def test_a_dotted_path_that_does_not_import_names_the_path():
    with pytest.raises(ConfigError, match=r"schedule.consumption.*'no_such_pkg.mod:Policy'.*no_such_pkg"):
        resolve_config({"schedule": {"consumption": "no_such_pkg.mod:Policy"}})


def test_a_users_policy_runs_by_dotted_path():
    s = resolve_config({"schedule": {"consumption": "test_schedule:EveryGroup"}}).schedule
    assert isinstance(make_consumption(s, 8), EveryGroup)


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        (
            {"consumption": "partial", "consumption_args": {"overprovison": 2}},
            r"partial'.*unknown argument 'overprovison'",
        ),
        (
            {"consumption": "partial", "consumption_args": {"overprovision": 0.5}},
            r"partial'.*'overprovision' must be >= 1, got 0.5",
        ),
        ({"consumption": "tail", "consumption_args": {"eta": "x"}}, r"tail'.*'eta' must be float, got 'x'"),
        (
            {"weight_sync": "drain", "weight_sync_args": {"every": 2}},
            r"'drain' takes no arguments, got every",
        ),
        (
            {"rollout": "speculative", "rollout_args": {"draft_versions": 0}},
            r"speculative'.*'draft_versions' must be > 0, got 0",
        ),
        (
            {"max_staleness": "auto", "staleness_args": {"k_min": 5, "k_max": 2}},
            r"staleness_args.*'k_min' must be in \[0, k_max=2\], got 5",
        ),
        (
            {"max_staleness": 2, "staleness_args": {"k_max": 3}},
            r"staleness_args.*only 'auto' takes arguments",
        ),
    ],
)
def test_a_bad_argument_names_the_policy_the_argument_and_the_value(schedule, message):
    data = {"schedule": schedule, "algo": {"correction": "decoupled"}, "pipeline": {"mode": "async"}}
    with pytest.raises(ConfigError, match=message):
        resolve_config(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"schedule": {"max_staleness": 2, "weight_sync": "inflight"}, "pipeline": {"mode": "async"}},
            r"algo.correction.*max_staleness 2 and weight_sync 'inflight' train on tokens from older weights",
        ),
        (
            {"schedule": {"rollout": "pruning"}, "pipeline": {"mode": "async"}},
            r"rollout mode 'pruning' does not run under the asynchronous pipeline.*asynchronous = False",
        ),
        (
            {"schedule": {"rollout": "speculative"}, "task": {"env": "tools"}},
            r"rollout mode 'speculative' does not run under multi-turn episodes.*multi_turn = False",
        ),
        (
            {"schedule": {"rollout": "pruning", "rollout_args": {"keep": 8}}},
            r"'keep' must be below sampling.group_size=8.*got 8",
        ),
        (
            {
                "schedule": {"admission": "las"},
                "engine": {"backend": "test_schedule:EngineWithoutPreemption"},
            },
            r"'schedule.admission': admission policy 'las' cannot run on engine "
            r"'test_schedule:EngineWithoutPreemption': it suspends the running calls of the most-served "
            r"programs, and the engine does not \(its features: park\)",
        ),
        (
            {
                "schedule": {"admission": "priority", "admission_args": {"preempt": True}},
                "engine": {"backend": "test_schedule:EngineWithoutPreemption"},
            },
            r"admission policy 'priority' cannot run on engine .*suspends lower-priority running requests",
        ),
        (
            {"schedule": {"tool_wait": "pin"}, "engine": {"backend": "test_schedule:EngineWithoutParking"}},
            r"tool_wait policy 'pin' cannot run on engine 'test_schedule:EngineWithoutParking': it keeps a "
            r"finished turn's keys and values for the next turn, and the engine does not \(its features: preempt\)",
        ),
        (
            {"schedule": {"migrate": True}},
            r"'schedule.migrate' moves requests between engines: it needs pipeline.mode 'async' and "
            r"pipeline.num_engines >= 2, got 'sync' with 1 engine",
        ),
        (
            {
                "schedule": {"migrate": True},
                "pipeline": {"mode": "async", "num_engines": 2},
                "task": {"name": "calc_tools", "env": "tools"},
            },
            r"'schedule.migrate' cannot run with task.env 'tools': an episode's turns",
        ),
    ],
)
def test_conflicting_policies_are_named_with_the_property_that_conflicts(data, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config(data)


def test_the_same_conflicts_are_refused_in_a_scenario():
    with pytest.raises(ConfigError, match=r"bad.yaml.*rollout mode 'speculative'.*multi_turn = False"):
        scenario_from_dict(
            {"workload": {"turns": 2}, "schedule": {"rollout": "speculative"}}, where="bad.yaml"
        )
    with pytest.raises(ConfigError, match=r"schedule.admission.*fcfs, lpt, spt.*'priority'"):
        scenario_from_dict({"schedule": {"admission": "priority"}})
    with pytest.raises(ConfigError, match=r"admission policy 'learned': argument 'checkpoint' is required"):
        scenario_from_dict({"schedule": {"admission": "learned"}})


def test_a_bad_schedule_leaves_no_run_directory(tmp_path):
    with pytest.raises(ConfigError):
        schedrl.train(
            {
                "out_dir": str(tmp_path),
                "schedule": {"consumption": "partial", "consumption_args": {"overprovision": 0}},
            }
        )
    assert list(tmp_path.iterdir()) == []


def test_the_staleness_bound_from_the_schedule():
    assert type(make_bound(Schedule(max_staleness=3))) is StalenessBound
    auto = make_bound(Schedule(max_staleness="auto", staleness_args={"k_min": 1, "k_max": 3, "high": 0.05}))
    assert isinstance(auto, AutoStaleness)
    assert (auto.k, auto.k_min, auto.k_max, auto.high) == (1, 1, 3, 0.05)
    assert Schedule(max_staleness="auto", staleness_args={"k_max": 6}).k_bound == 6


@pytest.mark.parametrize(
    ("section", "key", "new"),
    [
        ("pipeline", "max_staleness", "schedule.max_staleness"),
        ("pipeline", "overprovision", "schedule.consumption_args"),
        ("pipeline", "staleness_min", "schedule.staleness_args"),
        ("engine", "admission", "schedule.admission"),
        ("task", "tool_wait", "schedule.tool_wait"),
    ],
)
def test_an_old_key_in_a_recipe_names_the_new_one(section, key, new):
    with pytest.raises(ConfigError, match=rf"config key '{section}.{key}' was replaced: use {new}"):
        config_from_dict({section: {key: 1}})
    for old in ("data", "rollout"):
        with pytest.raises(ConfigError, match=rf"config key '{old}' was replaced: use schedule"):
            config_from_dict({old: {}})


def test_a_config_saved_before_the_schedule_section_resumes(tmp_path: Path):
    old = {
        "pipeline": {
            "mode": "async",
            "max_staleness": "auto",
            "staleness_min": 1,
            "staleness_max": 3,
            "auto_low": 0.001,
            "auto_high": 0.02,
            "stale": "mask",
            "weight_sync": "cut_resume",
            "consumption": "partial",
            "overprovision": 1.5,
            "num_engines": 1,
        },
        "engine": {"admission": "lpt", "admission_args": {"predictor": "history"}},
        "task": {"name": "sort", "tool_wait": "release", "tool_wait_args": {}},
        "data": {"scheduler": "e2h", "args": {"pool_size": 64}},
        "rollout": {"speculative": False, "draft_versions": 4, "prune_keep": 0},
        "algo": {"correction": "decoupled"},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(old))
    with pytest.raises(ConfigError, match="was replaced"):
        load_config(path)
    s = load_config(path, saved=True).schedule
    assert s == Schedule(
        max_staleness="auto",
        staleness_args={"k_min": 1, "k_max": 3, "low": 0.001, "high": 0.02},
        stale="mask",
        weight_sync="cut_resume",
        consumption="partial",
        consumption_args={"overprovision": 1.5},
        admission="lpt",
        admission_args={"predictor": "history"},
        data="e2h",
        data_args={"pool_size": 64},
    )
    pruned = {**old, "rollout": {"prune_keep": 4, "prune_mode": "keep"}}
    path.write_text(yaml.safe_dump(pruned))
    s = load_config(path, saved=True).schedule
    assert (s.rollout, s.rollout_args) == ("pruning", {"keep": 4, "mode": "keep"})


def test_a_lazy_entry_is_imported_on_first_use():
    from schedrl.registry import Registry

    r: Registry = Registry("policy")
    r.add_lazy("ordered", "collections:OrderedDict")
    assert "ordered" in r and r.names() == ["ordered"]
    import collections

    assert r.get("ordered") is collections.OrderedDict
    r.add_lazy("broken", "no_such_module:Thing")
    with pytest.raises(ValueError, match="policy 'no_such_module:Thing': cannot import module"):
        r.get("broken")
