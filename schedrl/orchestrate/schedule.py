"""A `Schedule` (`schedrl.config.Schedule`) checked against the policies it names, and built into them.

The same record drives a training run and a simulator scenario: `check_schedule` checks every policy's
arguments with that policy's own `Args` and the rules between policies, each stated by the policy
that owns it (`off_policy` of weight sync and consumption, `parks` of a tool-wait policy,
`multi_turn` and `asynchronous` of a rollout mode); the `make_*` functions build the policies the
loop runs. Checking loads nothing: no model, tokenizer or checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schedrl.config import ConfigError, RunConfig, Schedule, build_dataclass
from schedrl.data import SCHEDULERS
from schedrl.orchestrate.consumption import CONSUMPTION, Consumption
from schedrl.orchestrate.staleness import AutoStaleness, StalenessBound
from schedrl.orchestrate.weight_sync import WEIGHT_SYNC, WeightSync
from schedrl.registry import Registry
from schedrl.rollout.modes import ROLLOUT_MODES
from schedrl.rollout.registry import ADMISSION
from schedrl.rollout.tool_wait import TOOL_WAITS

# schedule field -> the registry of the policies it names
POLICIES: dict[str, Registry[Any]] = {
    "weight_sync": WEIGHT_SYNC,
    "consumption": CONSUMPTION,
    "admission": ADMISSION,
    "tool_wait": TOOL_WAITS,
    "rollout": ROLLOUT_MODES,
    "data": SCHEDULERS,
}


@dataclass(frozen=True)
class Run:
    """What the rules between a schedule's policies depend on, from the rest of a run's config."""

    asynchronous: bool = True  # the asynchronous pipeline (a request may outlive its weights)
    multi_turn: bool = False  # episodes with tools or an environment
    # what the engine can do (`engine.registry`: park, park_slots, preempt): a policy's `engine_needs` must be among them
    engine_features: frozenset[str] = frozenset({"park", "park_slots", "preempt"})
    engine: str = "builtin"  # its name, for messages
    corrected: bool = True  # an off-policy correction is configured (algo.correction)
    group_size: int = 8


def check_schedule(s: Schedule, run: Run = Run(), where: str = "schedule") -> None:
    """`ConfigError` naming the field, the policy and the argument (or both policies and why)."""
    for field, registry in POLICIES.items():
        try:
            registry.check(getattr(s, field), getattr(s, f"{field}_args"))
        except ValueError as err:
            raise ConfigError(f"config field '{where}.{field}': {err}") from None
    auto_args(s, where)
    rollout = ROLLOUT_MODES.build(s.rollout, s.rollout_args)
    try:
        rollout.check_run(run.group_size)
    except ValueError as err:
        raise ConfigError(f"config field '{where}.rollout_args': {err}") from None
    for flag, needed, what in (
        ("multi_turn", run.multi_turn, "multi-turn episodes (task.env is not single_turn)"),
        ("asynchronous", run.asynchronous, "the asynchronous pipeline (pipeline.mode: async)"),
    ):
        if needed and not getattr(rollout, flag):
            raise ConfigError(
                f"config field '{where}.rollout': rollout mode {s.rollout!r} does not run under {what} "
                f"({flag} = False)"
            )
    for field, registry in POLICIES.items():
        needs = getattr(registry.get(getattr(s, field)), "engine_needs", None)
        if needs is None:
            continue
        for feature, why in needs(registry.check(getattr(s, field), getattr(s, f"{field}_args"))).items():
            if feature not in run.engine_features:
                raise ConfigError(
                    f"config field '{where}.{field}': {field} policy {getattr(s, field)!r} cannot run on "
                    f"engine {run.engine!r}: it {why}, and the engine does not (its features: "
                    f"{', '.join(sorted(run.engine_features)) or 'none'})"
                )
    stale = off_policy(s)  # in one process too: the loop honours k there as well
    if stale and not run.corrected:
        raise ConfigError(
            f"config field 'algo.correction' is 'none', but {' and '.join(stale)} train on tokens from "
            "older weights; choose 'decoupled', 'tis' or 'cross_stage' so they are corrected"
        )


def off_policy(s: Schedule) -> list[str]:
    """The parts of `s` that make a batch hold tokens of older weights (off_policy = True), named."""
    out = [f"max_staleness {s.max_staleness!r}"] if s.max_staleness != 0 else []
    for field in ("weight_sync", "consumption"):
        name = getattr(s, field)
        if POLICIES[field].get(name).off_policy:
            out.append(f"{field} {name!r}")
    return out


def auto_args(s: Schedule, where: str = "schedule") -> AutoStaleness.Args | None:
    """The checked arguments of `max_staleness: auto` (None for a fixed k)."""
    if s.max_staleness != "auto":
        return None
    try:
        return build_dataclass(AutoStaleness.Args, dict(s.staleness_args), noun="argument")
    except (ConfigError, ValueError) as err:
        raise ConfigError(f"config field '{where}.staleness_args': max_staleness 'auto': {err}") from None


def make_bound(s: Schedule) -> StalenessBound:
    """The staleness bound: k fixed, or moved within [k_min, k_max] by `AutoStaleness`."""
    args = auto_args(s)
    if args is None:
        assert s.max_staleness != "auto"
        return StalenessBound(s.max_staleness)
    return AutoStaleness.of(args)


def make_weight_sync(s: Schedule) -> WeightSync:
    return WEIGHT_SYNC.build(s.weight_sync, s.weight_sync_args)


def make_consumption(s: Schedule, budget: int) -> Consumption:
    """The consumption policy of updates of `budget` samples."""
    return CONSUMPTION.build(s.consumption, s.consumption_args, budget)


def check_reward_delay(cfg: RunConfig, delay: int) -> None:
    """A task whose outcomes resolve up to `delay` batches after their batch is drawn (forecasting), against
    the schedule that must hold its samples that long; a `ConfigError` naming the field otherwise."""
    if delay <= 0:
        return
    s, name = cfg.schedule, cfg.task.name
    k = int(s.staleness_args.get("k_min", 0)) if s.max_staleness == "auto" else s.max_staleness
    if k < delay:
        field = "schedule.staleness_args.k_min" if s.max_staleness == "auto" else "schedule.max_staleness"
        raise ConfigError(
            f"config field '{field}' is {k}, but task {name!r} resolves its rewards up to {delay} batches "
            f"after they are drawn: its samples wait that long, so set it to at least {delay}"
        )
    allowed = {  # field: (its value, the values that work, why the others do not)
        "task.env": (cfg.task.env, ("single_turn",), "an episode's environment scores it as it ends"),
        "pipeline.reward_placement": (
            cfg.pipeline.reward_placement,
            ("driver", "separate"),
            "an engine worker scores a sample as it finishes",
        ),
        "schedule.rollout": (s.rollout, ("plain", "speculative"), "pruning needs each reward at once"),
    }
    for key, (value, ok, why) in allowed.items():
        if value not in ok:
            raise ConfigError(
                f"config field '{key}' must be {' or '.join(map(repr, ok))} for task {name!r}, whose rewards "
                f"resolve later, got {value!r}: {why}"
            )
