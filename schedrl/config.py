"""Typed run configuration: dataclasses, YAML loading, `--set a.b=c` overrides, clear errors.

Every field has a one-line doc. Loading checks every key and type against the
dataclasses and names the dotted field and the bad value on failure, e.g.
`config field 'sampling.group_size' must be > 0, got 0`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A config file or override names an unknown field or holds a bad value."""


@dataclass
class ModelConfig:
    path: str | None = None  # HF model directory; None builds the offline model `preset` names
    preset: Literal["tiny", "small"] = "tiny"  # with no path: tiny (~0.45M parameters) or small (~25M)
    tiny_seed: int = 0  # weight-init seed of the built-in model
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # auto: bfloat16 on a GPU, float32 on CPU
    # learner attention; auto: eager on CPU (faster on short rows), sdpa on GPU
    attn_implementation: str = "auto"


@dataclass
class TaskConfig:
    name: str = "addition"  # registered task name (see `schedrl tasks`)
    args: dict[str, Any] = field(default_factory=dict)  # keyword arguments of the task
    env: str = "single_turn"  # how an episode runs: single_turn, tools, or a dotted path to an environment
    env_args: dict[str, Any] = field(default_factory=dict)  # its arguments, e.g. {tools: ["pkg.mod:fn"]}
    max_turns: int = 4  # model turns per episode (multi-turn environments)
    # cap of each environment or tool answer, in tokens (head and tail kept)
    max_observation_tokens: int = 256
    env_timeout_s: float = 60.0  # an environment call (reset, step, close) past this ends its episode
    max_env_error_rate: float = 0.05  # stop when environments fail on more than this fraction of episodes
    max_turn_tokens: int | None = None  # budget of one model turn; None: what is left of max_new_tokens
    # a reward model mixed with the task's rule reward (schedrl.rewards): {path (a local
    # AutoModelForSequenceClassification directory), weight, rule_weight (both 1.0), batch_size, max_length,
    # truncation (left | right), template (auto | chat | plain), normalize (none | running)}
    reward_model: dict[str, Any] | None = None
    # context folding (multi-turn): {tokens, ask, stop, summary_tokens, carry}; an episode whose history
    # would pass `tokens` has the model summarise it and goes on from the summary (schedrl.rollout.folding)
    fold: dict[str, Any] | None = None
    # AgentRL's cross-policy sampling (multi-turn): {model: a local HF model directory with the policy's
    # tokenizer, p: the share of model turns it samples}; its turns are context, never trained
    cross_policy: dict[str, Any] | None = None


FOLD_FIELDS = {"tokens": int, "summary_tokens": int, "ask": str, "stop": str, "carry": str}


def _validate_fold(fold: dict[str, Any] | None, env: str) -> None:
    if fold is None:
        return
    if env == "single_turn":
        raise ConfigError("config field 'task.fold' needs a multi-turn task.env; it is 'single_turn'")
    for k, v in fold.items():
        if k not in FOLD_FIELDS:
            raise ConfigError(f"task.fold has no field {k!r}; its fields: {', '.join(FOLD_FIELDS)}")
        kind = FOLD_FIELDS[k]
        if kind is int and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ConfigError(f"config field 'task.fold.{k}' must be an integer >= 1, got {v!r}")
        if kind is str and (not isinstance(v, str) or (k != "carry" and not v)):
            raise ConfigError(f"config field 'task.fold.{k}' must be a non-empty string, got {v!r}")
    if "tokens" not in fold:
        raise ConfigError("config field 'task.fold' needs 'tokens', the token budget of a segment")


def _validate_cross_policy(cross: dict[str, Any] | None, env: str) -> None:
    if cross is None:
        return
    if env == "single_turn":
        raise ConfigError("config field 'task.cross_policy' needs a multi-turn task.env; it is 'single_turn'")
    unknown = sorted(set(cross) - {"model", "p"})
    if unknown:
        raise ConfigError(f"task.cross_policy has no field {unknown[0]!r}; its fields: model, p")
    model, p = cross.get("model"), cross.get("p")
    if not isinstance(model, str) or not model:
        raise ConfigError(f"config field 'task.cross_policy.model' must be a model directory, got {model!r}")
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0 < p < 1:  # at 1 nothing would train
        raise ConfigError(f"config field 'task.cross_policy.p' must be in (0, 1), got {p!r}")


@dataclass
class SamplingConfig:
    prompts_per_step: int = 16  # tasks drawn per training step
    group_size: int = 8  # samples per task (G)
    max_new_tokens: int = 8  # generation budget per sample
    temperature: float = 1.0  # sampling temperature (also used to recompute log-probs)
    top_p: float = 1.0  # nucleus mass kept
    top_k: int = 0  # keep the k most likely tokens; 0 keeps all


@dataclass
class EngineSection:
    # the engine (schedrl.engine.registry): builtin (schedrl's continuous batching over HF) or vllm (the extra)
    backend: str = "builtin"
    vllm: dict[str, Any] = field(
        default_factory=dict
    )  # vLLM EngineArgs settings, e.g. {enforce_eager: false}
    max_concurrency: int = 256  # requests in the engine's running batch
    max_batched_tokens: int = 8192  # tokens per engine forward
    prefill_prompt_once: bool = True  # the samples of a prompt admitted in one step prefill it once
    # cache slots beyond the running batch for trajectories parked during tool waits (schedule.tool_wait: pin)
    park_slots: int = 0
    # tokens per sequence, prompt and output (a multi-turn episode's whole history); None: the model's
    # context. An episode whose history outgrows it ends with "length", unless it folds (`task.fold`)
    max_model_len: int | None = None


@dataclass
class AlgoConfig:
    loss: str = "grpo"  # registered loss (see `schedrl list algos`) or pkg.module:name of a Loss
    # the loss's own arguments, checked by its Args when the run is built, e.g. {clip_eps_high: 0.28}
    loss_args: dict[str, Any] = field(default_factory=dict)
    advantage: str = "grpo"  # registered advantage estimator
    std_normalize: bool = True  # divide group-centred rewards by the group std
    # AgentRL's task-level normalisation for a multi-task mix: the advantages of each task type (the
    # task's domain) in a batch standardised among themselves, so no task's reward scale dominates
    task_normalize: bool = False
    # ML-engineering agents' duration-aware updates (multi-turn): each episode's advantage times its
    # environment time over the batch's mean, so slow actions are not outweighed by fast ones
    duration_aware: bool = False
    # multi-turn credit: broadcast (one advantage per trajectory) or return_to_go (one per turn)
    turn_credit: str = "broadcast"
    turn_discount: float = 1.0  # gamma of the per-turn return-to-go
    loss_agg: Literal["token_mean", "seq_mean"] = "token_mean"  # how token losses are averaged
    kl_coef: float = 0.0  # weight of the KL penalty to the frozen initial policy; 0 = off
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"  # KL estimator
    entropy_coef: float = 0.0  # entropy bonus weight
    correction: Literal["none", "decoupled", "tis", "cross_stage"] = "none"  # off-policy correction
    is_cap: float = 2.0  # cap C of the importance weights of a correction; >= 1, .inf = no cap

    def __post_init__(self) -> None:
        if not self.is_cap >= 1.0:
            raise ConfigError(f"config field 'algo.is_cap' must be >= 1, got {self.is_cap!r}")


@dataclass
class OptimConfig:
    lr: float = 3e-4  # peak learning rate
    weight_decay: float = 0.0  # AdamW weight decay
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW betas
    # learning-rate schedule: constant; warmup (linear warm-up, then constant); cosine or linear (warm-up,
    # then decay to 0 at the last update, as transformers' cosine and linear schedulers)
    schedule: Literal["constant", "warmup", "cosine", "linear"] = "constant"
    warmup_steps: int = 0  # linear warm-up steps (warmup, cosine and linear)
    max_grad_norm: float = 1.0  # gradient clipping; 0 disables
    micro_batch_size: int = 128  # sequences per forward/backward (gradient accumulation)
    micro_batch_tokens: int = 1024  # padded tokens per forward/backward (rows sorted by length); 0 = no cap
    padding_free: bool = True  # pack sequences into shared rows for the learner's forwards (checked once)
    # with padding_free: rows with the same prompt (a group's samples) forward it once (GRPO prefix reuse)
    forward_prompt_once: bool = True
    ppo_epochs: int = 1  # passes over each step's samples
    minibatches: int = 1  # optimizer steps per pass
    max_bad_steps: int = 5  # stop after this many non-finite losses in a row
    # recompute activations in the backward pass (less memory, ~20-30% more learner time); HF models only
    gradient_checkpointing: bool = False


@dataclass
class SFTConfig:
    steps: int = 30  # supervised warm-up steps before RL; 0 skips it
    batch_size: int = 32  # solutions per SFT step
    lr: float = 1e-3  # SFT learning rate


@dataclass
class EvalConfig:
    tasks: int = 200  # held-out tasks per evaluation
    k: int = 8  # samples per task for pass@k
    temperature: float = 1.0  # sampling temperature for pass@k
    every: int = 0  # evaluate every N training steps; 0 only before and after


@dataclass
class Schedule:
    """What runs when: one record for a training run (`schedule:`) and a simulator scenario. Each policy is a
    registered name, or `pkg.module:Class`, with its own arguments (`<policy>_args`), checked by that
    policy's `Args` when the run or the scenario is resolved (`schedrl.orchestrate.schedule`)."""

    max_staleness: int | Literal["auto"] = 0  # k: trained-on tokens are at most k versions old; auto adapts k
    # auto: AutoStaleness's arguments (k_min, k_max, low, high, ema, patience); empty for a fixed k
    staleness_args: dict[str, Any] = field(default_factory=dict)
    # tokens beyond k: drop their sample, keep them as context only (mask), or train on them (keep: k bounds
    # admission only, as APRIL's partial rollouts, which resume a sample across updates and train it whole)
    stale: Literal["drop", "mask", "keep"] = "drop"
    # when new weights reach the engines: drain (after they finish what they hold), inflight (between decode
    # steps, PipelineRL), cut_resume (cut every request, resume each from its prefix, APRIL)
    weight_sync: str = "drain"
    weight_sync_args: dict[str, Any] = field(default_factory=dict)  # its arguments
    # what an update trains on: wave (exactly its own data-scheduler batch), partial (the oldest complete
    # groups; unfinished ones carry over, APRIL), tail (RollPacker's tail batching)
    consumption: str = "wave"
    consumption_args: dict[str, Any] = field(default_factory=dict)  # e.g. partial {overprovision: 1.5}
    # the engine's admission order: fcfs, priority, static, lpt, spt, fcfs_guarded, past_future, learned
    admission: str = "fcfs"
    admission_args: dict[str, Any] = field(default_factory=dict)  # e.g. lpt {predictor: sibling}
    # what a trajectory holds while it waits on its environment: release, pin, priority or lockstep
    tool_wait: str = "release"
    tool_wait_args: dict[str, Any] = field(default_factory=dict)  # e.g. pin {quantile: 0.9}
    # how a step's samples are produced: plain, pruning (ARRoL), speculative (SPEC-RL)
    rollout: str = "plain"
    rollout_args: dict[str, Any] = field(default_factory=dict)  # e.g. pruning {keep: 4}
    data: str = "uniform"  # the data scheduler: which tasks each step trains on, how many samples each
    data_args: dict[str, Any] = field(default_factory=dict)  # e.g. coba {candidates: 64}
    # each sample to the engine holding the fewest requests, not whole groups (Seer's divided rollout)
    divide_groups: bool = False
    # long-tail migration (JigsawRL): an engine that runs dry takes half the requests of the busiest one
    # (the asynchronous pipeline with 2+ engines, and the simulator; `schedrl.engine.migration`)
    migrate: bool = False

    @property
    def k_bound(self) -> int:
        """The largest k the schedule can reach (auto: its k_max, 4 unless given)."""
        if self.max_staleness == "auto":
            return int(self.staleness_args.get("k_max", 4))
        return self.max_staleness


@dataclass
class PipelineConfig:
    # sync: one process, generate then train; async: engine and learner overlap
    mode: Literal["sync", "async"] = "sync"
    # async workers (schedrl.distributed.backend): threads of this process (one machine), ray (actors on a
    # cluster), local (serially, for debugging), or pkg.module:Backend
    backend: str = "threads"
    engine_chunk_steps: int = 8  # engine steps per call between the loop's bookkeeping
    ray_address: str | None = None  # join this Ray cluster; None starts a local one
    num_engines: int = 1  # engine workers; groups go to the one holding the fewest requests
    engine_cpus: int = 1  # cores (and torch threads) of each engine actor
    learner_cpus: int = (
        1  # cores (and torch threads) of the learner actor (of each rank's, with learner.ranks)
    )
    # Ray: run the engine actors, and the learner (every rank), on nodes started with
    # `ray start --labels schedrl-node=NAME`; None: anywhere
    engine_node: str | None = None
    learner_node: str | None = None  # the same for the learner (every rank of it)
    # a worker that answers no call (async) or a phase of a step that does not end (sync) for this long is
    # stuck: named with its stack; a stuck engine actor is replaced (Ray), anything else stops the run
    # (the last checkpoint resumes it); 0: wait forever
    worker_timeout_s: float = 600.0
    # every weight push carries its version, a checksum per bucket (a decoder layer each) and a probe: the
    # learner's greedy continuations of two fixed prompts; the engine reports what it loaded and reproduces
    # the probe, or the run stops naming the version and the bucket (schedrl.engine.weight_push)
    verify_pushes: bool = True
    # the largest |engine - learner| log-prob the probe accepts; None: 1e-3, or 5e-2 where the learner or the
    # engines compute in bfloat16 (learner.compute_dtype, model.dtype)
    probe_tol: float | None = None
    # where samples are scored (a reward model's device and cores): driver (this process, as samples come
    # back), colocated (in each engine worker, between its engine steps, on its cores and device) or
    # separate (a reward worker of its own: a thread, or a Ray actor of reward_cpus, scoring while the
    # engines decode). The synchronous mode runs its engine here: driver and colocated are the same there
    reward_placement: Literal["driver", "colocated", "separate"] = "driver"
    reward_cpus: float = 1.0  # the separate reward worker's Ray CPUs


@dataclass
class LearnerConfig:
    # how the learner holds the model: none (one process), ddp (a full copy on every rank, gradients
    # all-reduced) or fsdp2 (parameters, gradients and optimizer state sharded over the ranks)
    parallel: Literal["none", "ddp", "fsdp2"] = "none"
    ranks: int = 1  # learner processes in one process group (gloo on CPU, NCCL on CUDA)
    # the dtype the learner's forward and backward compute in: bfloat16 runs them under autocast (FSDP2: its
    # mixed precision, the gathered parameters in bfloat16, gradients reduced in float32); the parameters and
    # AdamW's state stay float32 either way (unless model.dtype makes the model bfloat16). auto: bfloat16
    # on a GPU, float32 on a CPU
    compute_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # LoRA adapters trained instead of the whole model (peft): {r, alpha, dropout, target_modules}
    # (defaults 16, 32, 0.0, the attention projections); the engines receive the adapters only
    lora: dict[str, Any] | None = None


@dataclass
class LoggingConfig:
    # where metrics are mirrored besides metrics.jsonl (always written): tensorboard, wandb, mlflow
    backends: tuple[str, ...] = ("jsonl", "tensorboard")
    project: str = "schedrl"  # W&B project / MLflow experiment
    wandb_mode: str | None = None  # online, offline or disabled; None: W&B's own default (WANDB_MODE)
    mlflow_tracking_uri: str | None = None  # None: a file store in the run directory (mlruns/)
    every: int = 1  # mirror every N-th step's metrics to the backends (metrics.jsonl gets every step)
    # multi-turn: each episode's model turns, environment calls and answers' waits as spans
    # (episodes.jsonl), exported with the workers' timeline as a Perfetto/Chrome trace (trace.json)
    episode_trace: bool = True


@dataclass
class RunConfig:
    seed: int = 0  # seeds data, sampling and initialisation
    steps: int = 300  # RL training steps
    out_dir: str = "runs"  # parent of run directories
    name: str | None = None  # run directory name; None = task name + timestamp
    save_every: int = 50  # checkpoint every N steps; 0 only at the end
    keep_last: int | None = 3  # checkpoints kept (None: all); older ones go once a newer one is complete
    max_reward_error_rate: float = 0.05  # stop when more than this fraction of rewards raise
    min_start_reward: float = 0.1  # warn when RL starts below this mean reward (collapse risk)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    engine: EngineSection = field(default_factory=EngineSection)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    schedule: Schedule = field(default_factory=Schedule)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


# Fields that must be > 0 or >= 0, by dotted name.
_POSITIVE = {
    "steps",
    "keep_last",
    "logging.every",
    "task.max_turns",
    "task.max_observation_tokens",
    "task.env_timeout_s",
    "sampling.prompts_per_step",
    "sampling.group_size",
    "sampling.max_new_tokens",
    "engine.max_concurrency",
    "engine.max_batched_tokens",
    "optim.lr",
    "learner.ranks",
    "optim.micro_batch_size",
    "optim.ppo_epochs",
    "optim.minibatches",
    "optim.max_bad_steps",
    "sft.batch_size",
    "sft.lr",
    "eval.k",
}
_NON_NEGATIVE = {
    "engine.park_slots",
    "save_every",
    "sampling.temperature",
    "sampling.top_k",
    "algo.kl_coef",
    "optim.weight_decay",
    "optim.warmup_steps",
    "optim.micro_batch_tokens",
    "optim.max_grad_norm",
    "sft.steps",
    "eval.tasks",
    "eval.every",
    "eval.temperature",
    "max_reward_error_rate",
    "task.max_env_error_rate",
    "pipeline.worker_timeout_s",
}


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is Literal:
        return " or ".join(map(repr, args))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, where: str, noun: str = "config field") -> Any:
    """Check `value` against annotation `tp`; return it converted (int -> float, list -> tuple). `noun`
    names what `where` is in errors ("config field", "argument")."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    bad = ConfigError(f"{noun} '{where}' must be {_type_name(tp)}, got {value!r}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{noun} '{where}' must be a mapping, got {value!r}")
        return _build(tp, value, where + ".", noun)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(value, arg, where, noun)
            except ConfigError:
                continue
        raise bad
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{noun} '{where}' must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        if not isinstance(value, list | tuple):
            raise bad
        return tuple(_convert(v, args[0], f"{where}[{i}]", noun) for i, v in enumerate(value))
    if origin is tuple:
        if not isinstance(value, list | tuple) or len(value) != len(args):
            raise bad
        return tuple(
            _convert(v, a, f"{where}[{i}]", noun) for i, (v, a) in enumerate(zip(value, args, strict=True))
        )
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise bad
        return dict(value)
    if tp is float:
        if isinstance(value, str):  # PyYAML reads 1e-3 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise bad from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad
        return float(value)
    if tp in (int, str, bool):
        if isinstance(value, bool) != (tp is bool) or not isinstance(value, tp):
            raise bad
        return value
    if tp is Any:
        return value
    raise TypeError(f"unsupported config annotation {tp!r} at {where}")


# The per-loss fields `algo:` held before `algo.loss_args`, with their defaults then (the losses' Args
# defaults now, so a saved config moves only the values that differ).
_OLD_LOSS_ARGS = {
    "clip_eps": 0.2,
    "clip_eps_high": None,
    "gae_gamma": 1.0,
    "gae_lambda": 0.95,
    "vf_coef": 0.1,
    "vf_clip": 0.2,
    "rover_temp": 1.0,
    "pacs_beta": 1.0,
}

# Keys that were replaced, with what replaces them.
_MOVED = {
    "pipeline.inflight_weight_updates": "schedule.weight_sync: inflight (true) or drain (false)",
    "engine.share_prompts": "engine.prefill_prompt_once (the engine prefills a group's prompt once)",
    "optim.share_prompts": "optim.forward_prompt_once (the learner forwards a group's prompt once)",
    "pipeline.partial_rollouts": "schedule.consumption: partial with schedule.weight_sync: cut_resume (true, "
    "without in-flight updates), or consumption: wave (false)",
    "pipeline.max_staleness": "schedule.max_staleness",
    "pipeline.stale": "schedule.stale",
    "pipeline.weight_sync": "schedule.weight_sync",
    "pipeline.consumption": "schedule.consumption",
    "pipeline.overprovision": "schedule.consumption_args: {overprovision: X} (partial) or {eta: X} (tail)",
    "pipeline.staleness_min": "schedule.staleness_args: {k_min: N} (with schedule.max_staleness: auto)",
    "pipeline.staleness_max": "schedule.staleness_args: {k_max: N} (with schedule.max_staleness: auto)",
    "pipeline.auto_low": "schedule.staleness_args: {low: X} (with schedule.max_staleness: auto)",
    "pipeline.auto_high": "schedule.staleness_args: {high: X} (with schedule.max_staleness: auto)",
    "engine.admission": "schedule.admission",
    "engine.admission_args": "schedule.admission_args",
    "task.tool_wait": "schedule.tool_wait",
    "task.tool_wait_args": "schedule.tool_wait_args",
    "data": "schedule.data (the scheduler's name) and schedule.data_args (its arguments)",
    "rollout": "schedule.rollout: speculative or pruning, with schedule.rollout_args (speculative: "
    "{draft_versions}; pruning: {keep, success_frac, check_tokens, mode})",
    "algo.name": "algo.loss",
    **{f"algo.{key}": f"algo.loss_args: {{{key}: ...}}" for key in _OLD_LOSS_ARGS},
}


def _build(cls: type, data: dict[str, Any], prefix: str = "", noun: str = "config field") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    for key in data:
        if prefix + key in _MOVED:
            raise ConfigError(f"config key '{prefix}{key}' was replaced: use {_MOVED[prefix + key]}")
        if key not in names and noun == "config field":
            raise ConfigError(f"unknown config key '{prefix}{key}'; valid keys here: {', '.join(names)}")
        if key not in names:
            raise ConfigError(f"unknown {noun} '{prefix}{key}'; valid: {', '.join(names) or 'none'}")
    return cls(**{k: _convert(v, hints[k], prefix + k, noun) for k, v in data.items()})


def _validate(cfg: RunConfig) -> None:
    for dotted in _POSITIVE | _NON_NEGATIVE:
        obj: Any = cfg
        for part in dotted.split("."):
            obj = getattr(obj, part)
        if obj is None:  # an optional field left unset (keep_last: None keeps every checkpoint)
            continue
        if dotted in _POSITIVE and obj <= 0:
            raise ConfigError(f"config field '{dotted}' must be > 0, got {obj!r}")
        if dotted in _NON_NEGATIVE and obj < 0:
            raise ConfigError(f"config field '{dotted}' must be >= 0, got {obj!r}")
    _validate_schedule(cfg.schedule)
    _validate_pipeline(cfg.pipeline)
    _validate_task(cfg)
    if cfg.logging.wandb_mode not in (None, "online", "offline", "disabled"):
        raise ConfigError(
            f"config field 'logging.wandb_mode' must be online, offline or disabled, got {cfg.logging.wandb_mode!r}"
        )
    if not 0 < cfg.sampling.top_p <= 1:
        raise ConfigError(f"config field 'sampling.top_p' must be in (0, 1], got {cfg.sampling.top_p!r}")
    if cfg.sampling.prompts_per_step * cfg.sampling.group_size < cfg.optim.minibatches:
        raise ConfigError(
            f"config field 'optim.minibatches' ({cfg.optim.minibatches}) exceeds the samples per step "
            f"({cfg.sampling.prompts_per_step * cfg.sampling.group_size})"
        )


def _validate_task(cfg: RunConfig) -> None:
    t = cfg.task
    if not 0.0 <= cfg.algo.turn_discount <= 1.0:
        raise ConfigError(
            f"config field 'algo.turn_discount' must be in [0, 1], got {cfg.algo.turn_discount!r}"
        )
    if t.max_env_error_rate > 1:
        raise ConfigError(
            f"config field 'task.max_env_error_rate' must be in [0, 1], got {t.max_env_error_rate!r}"
        )
    if t.max_turn_tokens is not None and t.max_turn_tokens <= 0:
        raise ConfigError(f"config field 'task.max_turn_tokens' must be > 0, got {t.max_turn_tokens!r}")
    _validate_fold(t.fold, t.env)
    _validate_cross_policy(t.cross_policy, t.env)
    if cfg.algo.duration_aware and t.env == "single_turn":
        raise ConfigError(
            "config field 'algo.duration_aware' weighs episodes by their environment time: it needs a "
            "multi-turn task.env; it is 'single_turn'"
        )
    m = cfg.engine.max_model_len
    if m is not None and (not isinstance(m, int) or isinstance(m, bool) or m < 2):
        raise ConfigError(f"config field 'engine.max_model_len' must be an integer >= 2 or null, got {m!r}")


def _validate_schedule(s: Schedule, where: str = "schedule") -> None:
    """What the record alone can tell; each policy's own arguments are checked by its `Args` when the
    schedule is resolved (`schedrl.orchestrate.schedule.check_schedule`)."""
    if s.max_staleness != "auto" and s.max_staleness < 0:
        raise ConfigError(
            f"config field '{where}.max_staleness' must be >= 0 or 'auto', got {s.max_staleness!r}"
        )
    if s.max_staleness != "auto" and s.staleness_args:
        raise ConfigError(
            f"config field '{where}.staleness_args' ({', '.join(sorted(s.staleness_args))}) is set but "
            f"{where}.max_staleness is {s.max_staleness!r}: only 'auto' takes arguments"
        )


def _validate_pipeline(p: PipelineConfig) -> None:
    for name in ("engine_chunk_steps", "num_engines", "engine_cpus", "learner_cpus", "reward_cpus"):
        if getattr(p, name) <= 0:
            raise ConfigError(f"config field 'pipeline.{name}' must be > 0, got {getattr(p, name)!r}")


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=c` -> (["a", "b"], c parsed as a YAML scalar)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.path=value")
    key, raw = text.split("=", 1)
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({problem})") from None
    return key.split("."), value


def apply_sets(data: dict[str, Any] | None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """`data` (a copy) with `a.b=c` overrides (the CLI's --set) written in."""
    data = dict(data or {})
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: '{part}' is not a section")
        node[path[-1]] = value
    return data


def build_dataclass(cls: type, data: dict[str, Any], prefix: str = "", noun: str = "config field") -> Any:
    """`cls` (a config dataclass, sections nested) from a mapping: every key known and typed, or a
    `ConfigError` naming the dotted field and the bad value; `noun` says what a field is in messages
    ("config field", or "argument" for a policy's `Args`)."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"config{' ' + prefix.rstrip('.') if prefix else ''} must be a mapping, got {data!r}"
        )
    return _build(cls, data, prefix, noun)


def config_from_dict(data: dict[str, Any] | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Build and validate a `RunConfig` from a nested dict plus `a.b=c` overrides."""
    cfg = _build(RunConfig, apply_sets(data, overrides))
    _validate(cfg)
    return cfg


def migrate_saved(data: dict[str, Any]) -> dict[str, Any]:
    """A run directory's saved config written before keys were replaced (`_MOVED`), in today's keys.

    A saved config holds every field, defaults included, so its old keys are translated rather than
    refused; a recipe a user writes gets the migration error instead."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    p = data.get("pipeline")
    if isinstance(p, dict) and ("inflight_weight_updates" in p or "partial_rollouts" in p):
        inflight, partial = p.pop("inflight_weight_updates", False), p.pop("partial_rollouts", False)
        p.setdefault("weight_sync", "inflight" if inflight else "cut_resume" if partial else "drain")
        p.setdefault("consumption", "partial" if partial else "wave")
    for section, new in (("engine", "prefill_prompt_once"), ("optim", "forward_prompt_once")):
        sec = data.get(section)
        if isinstance(sec, dict) and "share_prompts" in sec:
            sec.setdefault(new, sec.pop("share_prompts"))
    a = data.get("algo")
    if isinstance(a, dict) and ("name" in a or not _OLD_LOSS_ARGS.keys().isdisjoint(a)):
        a["loss"] = a.pop("name", a.get("loss", "grpo"))
        moved = {k: a.pop(k) for k in _OLD_LOSS_ARGS if k in a}
        args = {k: v for k, v in moved.items() if v != _OLD_LOSS_ARGS[k]}
        if a["loss"] == "rapid" and a.get("is_cap", 2.0) != 2.0:  # rapid's cap was algo.is_cap then
            args["is_cap"] = a["is_cap"]
        a["loss_args"] = {**args, **(a.get("loss_args") or {})}
    if "schedule" not in data:
        data["schedule"] = _saved_schedule(data)
    return data


def _saved_schedule(data: dict[str, Any]) -> dict[str, Any]:
    """The `schedule` section of a config saved before it existed, from the sections its keys lived in
    (which lose them)."""
    p, e, t = (data.setdefault(k, {}) for k in ("pipeline", "engine", "task"))
    out: dict[str, Any] = {
        k: p.pop(k) for k in ("max_staleness", "stale", "weight_sync", "consumption") if k in p
    }
    auto = {"staleness_min": "k_min", "staleness_max": "k_max", "auto_low": "low", "auto_high": "high"}
    staleness_args = {new: p.pop(old) for old, new in auto.items() if old in p}
    if out.get("max_staleness") == "auto":
        out["staleness_args"] = staleness_args
    over = p.pop("overprovision", 1.0)
    consumption = out.get("consumption", "wave")
    if consumption in ("partial", "tail"):
        out["consumption_args"] = {"overprovision" if consumption == "partial" else "eta": over}
    for key, section in (("admission", e), ("admission_args", e), ("tool_wait", t), ("tool_wait_args", t)):
        if key in section:
            out[key] = section.pop(key)
    d = data.pop("data", None) or {}
    if "scheduler" in d:
        out["data"], out["data_args"] = d["scheduler"], d.get("args", {})
    r = data.pop("rollout", None) or {}
    if r.get("speculative"):
        out["rollout"], out["rollout_args"] = "speculative", {"draft_versions": r.get("draft_versions", 4)}
    elif r.get("prune_keep"):
        names = {
            "prune_keep": "keep",
            "prune_success_frac": "success_frac",
            "prune_check_tokens": "check_tokens",
        }
        out["rollout"] = "pruning"
        out["rollout_args"] = {
            new: r[old] for old, new in {**names, "prune_mode": "mode"}.items() if old in r
        }
    return out


def read_recipe(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML recipe holds; a missing file, bad YAML or a non-mapping top names the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {str(path)!r} must hold a mapping at the top, got {type(data).__name__}"
        )
    return data


def load_config(
    path: str | Path | None = None, overrides: Sequence[str] = (), saved: bool = False
) -> RunConfig:
    """Load a YAML recipe (or the defaults when `path` is None) and apply overrides; `saved`: the file is
    a run directory's own config.yaml, whose replaced keys are translated (`migrate_saved`)."""
    data = read_recipe(path) if path is not None else {}
    if saved:
        data = migrate_saved(data)
    if "env" in data and "task" not in data:
        raise ConfigError(
            f"{path}: a classic PPO recipe (it has an `env:` section); `schedrl train` runs it, the LM "
            "commands (sft, eval) do not"
        )
    try:
        return config_from_dict(data, overrides)
    except ConfigError as err:
        if path is None:
            raise
        raise ConfigError(f"{path}: {err}") from None


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A plain nested dict (tuples as lists) of a config dataclass (a `RunConfig`, a `ClassicConfig`) that
    its reader (`config_from_dict`, `classic_config_from_dict`) reads back to an equal config."""

    def plain(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [plain(v) for v in x]
        return x

    return plain(dataclasses.asdict(cfg))
