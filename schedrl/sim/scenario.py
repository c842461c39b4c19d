"""A simulation scenario: the model, the workload, the cluster, the costs and the schedule, in YAML.

Every key is checked: an unknown key, a negative cost or a distribution that cannot be sampled is an
error naming the key and the file. Costs not given are derived from the model and the GPU
(`EngineCost.from_hardware`); a scenario states each assumption next to its value and source.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from schedrl.config import ConfigError, Schedule, apply_sets, build_dataclass, read_recipe
from schedrl.orchestrate.schedule import Run, check_schedule
from schedrl.rollout.tool_wait import TOOL_WAITS
from schedrl.sim.costs import GPUS, EngineCost, LearnerCost, SyncCost
from schedrl.sim.lengths import DistributionError, LengthDist


@dataclass
class ModelSection:
    params_b: float = 7.0  # parameters, billions
    active_params_b: float | None = None  # a mixture of experts: parameters active per token
    bytes_per_param: float = 2.0  # bf16
    kv_bytes_per_token: float = 57344.0  # layers x kv heads x head dim x 2 (k, v) x 2 bytes (Qwen2.5-7B)


@dataclass
class WorkloadSection:
    prompts_per_step: int = 64  # tasks per RL step
    group_size: int = 8  # samples per task
    prompt_tokens: int = 512  # tokens of each prompt
    lengths: LengthDist = field(default_factory=LengthDist)
    predictor_sigma: float = 0.5  # length-ordered admission: predictions off by a log-normal factor
    # multi-turn samples: a sample's length splits evenly into `turns` model turns; after each but the
    # last it leaves the engine for a tool call of tool_wait_s x exp(N(0, tool_wait_sigma)) seconds, and
    # comes back with `tool_tokens` more context, prefilled again with the whole history
    turns: int = 1
    tool_wait_s: float = 0.0  # median seconds of a tool call
    tool_wait_sigma: float = 0.0  # log-normal spread of a tool call's seconds
    tool_tokens: int = 0  # tokens a tool's answer adds to the context
    # what a sample holds while it waits is the schedule's tool_wait, the pipeline's own policies
    # (schedrl.rollout.tool_wait): release, pin, priority, lockstep (TRL's tool loop)
    park_slots: int = 64  # pin: trajectories an engine keeps parked at once (the earliest to expire goes)
    # (assumed) k3 KL per token that one version of staleness adds: the mismatch max_staleness auto follows
    drift_kl: float = 0.0


@dataclass
class ClusterSection:
    gpus: int = 8  # GPUs of the whole cluster
    gpu: str = "h100"  # the GPU's name in the simulator's table of peak FLOP/s and bandwidth
    memory_gb: float = 80.0  # memory per GPU
    gpus_per_engine: int = 1  # tensor parallel size of an engine instance
    # colocated: engines and learner take turns on every GPU; disaggregated: each has its own GPUs
    placement: Literal["colocated", "disaggregated"] = "colocated"
    rollout_gpus: int = 0  # disaggregated: GPUs of the engines; the rest train
    switch_s: float = 0.0  # colocated: seconds to swap generation and training states, each way
    # disaggregated on shared hosts (the threads backend: workers share cores, memory bandwidth and the
    # GIL): how much slower an engine step and an update run than alone; 1.0 where devices are separate
    engine_interference: float = 1.0
    learner_interference: float = 1.0  # the same for an update
    # when they apply: always, or only while the other side works (an engine step while an update runs,
    # an update while engines hold requests): what a microbenchmark of the two side by side measures
    interference: Literal["always", "overlap"] = "always"


@dataclass
class EngineCostSection:
    """The engine's cost coefficients (the run config's `EngineSection` holds a real engine's settings)."""

    mbu: float = 0.6  # fraction of HBM bandwidth a decode step achieves
    mfu: float = 0.4  # fraction of peak FLOP/s a step achieves
    overhead_s: float = 0.005  # per decode step
    max_batch: int = 256  # running requests per engine
    max_batched_tokens: int | None = None  # prefill tokens an admission may add (None: no cap)
    memory_util: float = 0.9  # fraction of an engine's memory for weights and keys and values
    # explicit coefficients (None: derived from the model and the GPU)
    weights_s: float | None = None
    kv_token_s: float | None = None  # per token of context a decode step reads
    compute_token_s: float | None = None  # per token a decode step computes
    prefill_token_s: float | None = None  # per prompt token prefilled
    # per key of a decode step's attention padded to the batch's longest context (the built-in engine
    # on a CPU pads; a paged-attention engine does not: 0)
    padded_key_s: float = 0.0
    kv_capacity_tokens: int | None = None  # tokens of keys and values an engine holds (None: from memory)
    combine: Literal["max", "sum"] = "max"  # sum: memory and compute time add (a CPU)


@dataclass
class Scenario:
    name: str = "scenario"  # shown in the tables; a variant's is "file name: variant"
    source: str = ""  # where the numbers come from
    steps: int = 6  # RL steps to simulate
    warmup_steps: int = 1  # steps left out of the means (the pipeline filling)
    # learner updates per step: a step's prompts split into this many batches, each its own update and
    # weight sync (streaming trainers, e.g. verl fully async's require_batches x mini-batch); k counts updates
    updates_per_step: int = 1
    seed: int = 0  # sampled lengths and tool waits derive from it
    model: ModelSection = field(default_factory=ModelSection)
    workload: WorkloadSection = field(default_factory=WorkloadSection)
    cluster: ClusterSection = field(default_factory=ClusterSection)
    engine: EngineCostSection = field(default_factory=EngineCostSection)
    learner: LearnerCost = field(default_factory=LearnerCost)
    sync: SyncCost = field(default_factory=SyncCost)
    schedule: Schedule = field(default_factory=Schedule)
    measured: dict[str, Any] = field(default_factory=dict)  # published or measured figures to compare with

    # ---- derived ---------------------------------------------------------------------------------
    @property
    def variant(self) -> str:
        """The variant's name in its file (the whole name for a file without variants)."""
        return self.name.split(": ")[-1]

    @property
    def weight_bytes(self) -> float:
        return self.model.params_b * 1e9 * self.model.bytes_per_param

    @property
    def engine_gpus(self) -> int:
        c = self.cluster
        return c.gpus if c.placement == "colocated" else c.rollout_gpus

    @property
    def learner_gpus(self) -> int:
        c = self.cluster
        return c.gpus if c.placement == "colocated" else c.gpus - c.rollout_gpus

    @property
    def num_engines(self) -> int:
        return self.engine_gpus // self.cluster.gpus_per_engine

    def engine_cost(self) -> EngineCost:
        e, m, c = self.engine, self.model, self.cluster
        cost = EngineCost.from_hardware(
            m.params_b,
            c.gpu,
            c.gpus_per_engine,
            m.bytes_per_param,
            m.kv_bytes_per_token,
            e.mbu,
            e.mfu,
            e.overhead_s,
            e.max_batch,
            c.memory_gb,
            e.memory_util,
            m.active_params_b,
        )
        given = {k: getattr(e, k) for k in ("weights_s", "kv_token_s", "compute_token_s", "prefill_token_s")}
        given["kv_capacity_tokens"] = e.kv_capacity_tokens
        given["combine"] = e.combine
        given["padded_key_s"] = e.padded_key_s
        cost = dataclasses.replace(cost, **{k: v for k, v in given.items() if v is not None})
        f = c.engine_interference if c.placement == "disaggregated" and c.interference == "always" else 1.0
        if f != 1.0:
            cost = dataclasses.replace(
                cost,
                overhead_s=cost.overhead_s * f,
                weights_s=cost.weights_s * f,
                kv_token_s=cost.kv_token_s * f,
                compute_token_s=cost.compute_token_s * f,
                prefill_token_s=cost.prefill_token_s * f,
                padded_key_s=cost.padded_key_s * f,
            )
        return cost


_POSITIVE = (
    "steps",
    "updates_per_step",
    "workload.prompts_per_step",
    "workload.group_size",
    "workload.prompt_tokens",
    "workload.turns",
    "cluster.gpus",
    "cluster.gpus_per_engine",
    "cluster.memory_gb",
    "engine.max_batch",
    "engine.mbu",
    "engine.mfu",
    "model.params_b",
    "learner.tokens_per_s_per_gpu",
    "sync.bandwidth_gbs",
)
SIM_ADMISSION = ("fcfs", "lpt", "spt")  # what the simulated engine orders by (its jobs' given predictions)


def _numbers(obj: Any, prefix: str = ""):
    """(dotted key, value) of every number in a dataclass tree."""
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            yield from _numbers(v, f"{prefix}{f.name}.")
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            yield f"{prefix}{f.name}", v


def scenario_from_dict(data: dict[str, Any], overrides=(), where: str = "scenario") -> Scenario:
    """A checked `Scenario` from a mapping (plus `a.b=c` overrides); errors name `where` and the key."""
    try:
        s = build_dataclass(Scenario, apply_sets(data, overrides))
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    for key, value in _numbers(s):
        if value < 0:
            raise ConfigError(f"{where}: '{key}' must be >= 0 (a cost, a count or a fraction), got {value!r}")
    for key in _POSITIVE:
        obj: Any = s
        for part in key.split("."):
            obj = getattr(obj, part)
        if obj <= 0:
            raise ConfigError(f"{where}: '{key}' must be > 0, got {obj!r}")
    c = s.cluster
    if c.gpu not in GPUS:
        raise ConfigError(f"{where}: 'cluster.gpu' must be one of {', '.join(GPUS)}, got {c.gpu!r}")
    if c.placement == "disaggregated" and not 0 < c.rollout_gpus < c.gpus:
        raise ConfigError(
            f"{where}: 'cluster.rollout_gpus' must be between 0 and cluster.gpus ({c.gpus}) when disaggregated, "
            f"got {c.rollout_gpus!r}"
        )
    if s.engine_gpus % c.gpus_per_engine:
        raise ConfigError(
            f"{where}: 'cluster.gpus_per_engine' ({c.gpus_per_engine}) must divide the engines' GPUs ({s.engine_gpus})"
        )
    if s.workload.prompts_per_step % s.updates_per_step:
        raise ConfigError(
            f"{where}: 'updates_per_step' ({s.updates_per_step}) must divide 'workload.prompts_per_step' "
            f"({s.workload.prompts_per_step})"
        )
    sch = s.schedule
    try:
        _check_schedule(s)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    if TOOL_WAITS.get(sch.tool_wait).parks and s.workload.park_slots < 1:
        raise ConfigError(
            f"{where}: 'workload.park_slots' must be >= 1 with tool_wait {sch.tool_wait!r} (parks = True), "
            f"got {s.workload.park_slots!r}"
        )
    if s.warmup_steps >= s.steps:
        raise ConfigError(f"{where}: 'warmup_steps' ({s.warmup_steps}) must be below 'steps' ({s.steps})")
    try:
        s.workload.lengths.check("workload.lengths")
        s.engine_cost()
    except (DistributionError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from None
    return s


def _check_schedule(s: Scenario) -> None:
    """The schedule, checked as a training run's is (every policy's `Args`, the rules between them),
    plus what the simulator models: admission by the jobs' given predictions, no rollout modes."""
    wl, sch = s.workload, s.schedule
    check_schedule(sch, Run(multi_turn=wl.turns > 1, group_size=wl.group_size))
    if sch.admission not in SIM_ADMISSION:
        raise ConfigError(
            f"config field 'schedule.admission' must be one of {', '.join(SIM_ADMISSION)} in the simulator "
            f"(it orders by the jobs' given length predictions), got {sch.admission!r}"
        )
    if sch.rollout != "plain" or sch.data != "uniform":
        raise ConfigError(
            "config fields 'schedule.rollout' and 'schedule.data': the simulator draws lengths, not tasks: "
            f"it runs rollout 'plain' and data 'uniform', got {sch.rollout!r} and {sch.data!r}"
        )


CLAIM_METRICS = ("steps_per_s", "rollout_tokens_per_s")  # higher is better: a claim is a speedup


@dataclass(frozen=True)
class Claim:
    """A published speedup between two variants of a file: `metric` of `variant` over that of `over`."""

    name: str
    metric: str
    variant: str
    over: str
    published: float
    source: str = ""


def claims_from_dict(data: dict[str, Any], path: str = "scenario") -> list[Claim]:
    """The file's `claims:` (name -> {metric, variant, over, published, source}), checked against its
    variants; errors name the file and the claim."""
    raw = data.get("claims") or {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{path}: 'claims' must be a mapping of name -> {{metric, variant, over, published}}"
        )
    variants = set(data.get("variants") or {})
    fields = {f.name for f in dataclasses.fields(Claim)} - {"name"}
    out = []
    for name, c in raw.items():
        where = f"{path} (claim {name!r})"
        if not isinstance(c, dict) or set(c) - fields or not {"variant", "over", "published"} <= set(c):
            raise ConfigError(
                f"{where}: a claim holds variant, over, published and optionally metric, source; got {c!r}"
            )
        claim = Claim(str(name), **{"metric": "steps_per_s", **c})
        if claim.metric not in CLAIM_METRICS:
            raise ConfigError(
                f"{where}: 'metric' must be one of {', '.join(CLAIM_METRICS)}, got {claim.metric!r}"
            )
        for key in ("variant", "over"):
            if getattr(claim, key) not in variants:
                raise ConfigError(
                    f"{where}: '{key}' must name a variant ({', '.join(variants) or 'none'}), got {getattr(claim, key)!r}"
                )
        if not isinstance(claim.published, (int, float)) or claim.published <= 0:
            raise ConfigError(f"{where}: 'published' must be a ratio > 0, got {claim.published!r}")
        out.append(claim)
    return out


def load_scenario(path: str | Path, overrides=()) -> Scenario:
    """The scenario a YAML file holds (plus `a.b=c` overrides); a file with variants gives its first."""
    return load_variants(path, overrides)[0]


def load_variants(path: str | Path, overrides=()) -> list[Scenario]:
    """Every scenario a YAML file holds: the base, or one per entry of its `variants:` mapping.

    A variant is `{set: {dotted.key: value, ...}, measured: {...}}`: the base with those keys replaced
    and its own measured figures (a row of a published table). Errors name the file and the variant.
    """
    return variants_from_dict(read_recipe(path), overrides, str(path))


def variant_sources(
    data: dict[str, Any], path: str = "scenario"
) -> dict[str, tuple[dict[str, Any], list[str]]]:
    """Variant name -> (its base mapping, its `set` lines): what `scenario_from_dict` builds it from.
    A file without variants is one, named by the file's `name`."""
    data = dict(data)
    data.pop("claims", None)
    variants = data.pop("variants", None)
    if variants is None:
        return {str(data.get("name", "scenario")): (data, [])}
    if not isinstance(variants, dict) or not variants:
        raise ConfigError(f"{path}: 'variants' must be a mapping of name -> {{set: ..., measured: ...}}")
    out = {}
    for name, v in variants.items():
        v = v or {}
        if not isinstance(v, dict) or set(v) - {"set", "measured"}:
            raise ConfigError(
                f"{path} (variant {name!r}): a variant holds only 'set' and 'measured', got {v!r}"
            )
        base = copy.deepcopy(data)
        base["name"] = f"{data.get('name', 'scenario')}: {name}"
        base["measured"] = dict(v.get("measured") or {})
        out[str(name)] = (base, [f"{k}={json.dumps(val)}" for k, val in (v.get("set") or {}).items()])
    return out


def variants_from_dict(data: dict[str, Any], overrides=(), path: str = "scenario") -> list[Scenario]:
    """`load_variants` of a mapping; `path` names it in errors."""
    sources = variant_sources(data, path)
    if "variants" not in data:
        return [scenario_from_dict(next(iter(sources.values()))[0], overrides, where=str(path))]
    return [
        scenario_from_dict(base, [*sets, *overrides], where=f"{path} (variant {name!r})")
        for name, (base, sets) in sources.items()
    ]
