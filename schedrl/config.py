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
    path: str | None = None  # HF model directory; None builds the offline tiny model
    tiny_seed: int = 0  # weight-init seed of the tiny model
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
    # what a trajectory holds while it waits on its environment: release, pin, priority or lockstep
    tool_wait: str = "release"
    tool_wait_args: dict[str, Any] = field(default_factory=dict)  # its arguments, e.g. {quantile: 0.9}


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
    backend: str = "builtin"  # builtin (schedrl's continuous batching over HF) or vllm (the vllm extra)
    vllm: dict[str, Any] = field(
        default_factory=dict
    )  # vLLM EngineArgs settings, e.g. {enforce_eager: false}
    max_concurrency: int = 256  # requests in the engine's running batch
    max_batched_tokens: int = 8192  # tokens per engine forward
    admission: str = (
        "fcfs"  # admission policy: fcfs, priority, static, lpt, spt, fcfs_guarded, past_future, learned
    )
    admission_args: dict[str, Any] = field(default_factory=dict)  # its arguments, e.g. {predictor: sibling}
    prefill_prompt_once: bool = True  # the samples of a prompt admitted in one step prefill it once
    # cache slots beyond the running batch for trajectories parked during tool waits (task.tool_wait: pin)
    park_slots: int = 0


@dataclass
class AlgoConfig:
    name: str = "grpo"  # registered loss
    advantage: str = "grpo"  # registered advantage estimator
    std_normalize: bool = True  # divide group-centred rewards by the group std
    # multi-turn credit: broadcast (one advantage per trajectory) or return_to_go (one per turn)
    turn_credit: str = "broadcast"
    turn_discount: float = 1.0  # gamma of the per-turn return-to-go
    clip_eps: float = 0.2  # PPO clip range (low side)
    clip_eps_high: float | None = None  # PPO clip range (high side); None = clip_eps
    loss_agg: Literal["token_mean", "seq_mean"] = "token_mean"  # how token losses are averaged
    kl_coef: float = 0.0  # weight of the KL penalty to the frozen initial policy; 0 = off
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"  # KL estimator
    entropy_coef: float = 0.0  # entropy bonus weight
    correction: Literal["none", "decoupled", "tis", "cross_stage"] = "none"  # off-policy correction
    is_cap: float = 2.0  # cap C of the importance weights of a correction; >= 1, .inf = no cap
    gae_gamma: float = 1.0  # GAE discount (losses with a value head: ppo)
    gae_lambda: float = 0.95  # GAE lambda (ppo)
    vf_coef: float = 0.1  # weight of the value loss (losses with a value head: ppo, sao)
    vf_clip: float | None = 0.2  # clip range of the value around the old value (ppo); None = no clipping
    rover_temp: float = 1.0  # rho of rover: Q = rho * log(pi_theta / pi_old)
    pacs_beta: float = 1.0  # beta of pacs: score = beta * log(pi_theta / pi_old) of the sequence

    def __post_init__(self) -> None:
        if not self.is_cap >= 1.0:
            raise ConfigError(f"config field 'algo.is_cap' must be >= 1, got {self.is_cap!r}")
        for name in ("gae_gamma", "gae_lambda"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"config field 'algo.{name}' must be in [0, 1], got {value!r}")
        for name in ("rover_temp", "pacs_beta"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"config field 'algo.{name}' must be > 0, got {getattr(self, name)!r}")
        if self.vf_coef < 0 or (self.vf_clip is not None and self.vf_clip < 0):
            bad = "vf_coef" if self.vf_coef < 0 else "vf_clip"
            raise ConfigError(f"config field 'algo.{bad}' must be >= 0, got {getattr(self, bad)!r}")


@dataclass
class OptimConfig:
    lr: float = 3e-4  # peak learning rate
    weight_decay: float = 0.0  # AdamW weight decay
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW betas
    schedule: Literal["constant", "warmup", "cosine"] = "constant"  # learning-rate schedule
    warmup_steps: int = 0  # linear warm-up steps (warmup and cosine)
    max_grad_norm: float = 1.0  # gradient clipping; 0 disables
    micro_batch_size: int = 128  # sequences per forward/backward (gradient accumulation)
    micro_batch_tokens: int = 1024  # padded tokens per forward/backward (rows sorted by length); 0 = no cap
    padding_free: bool = True  # pack sequences into shared rows for the learner's forwards (checked once)
    # with padding_free: rows with the same prompt (a group's samples) forward it once (GRPO prefix reuse)
    forward_prompt_once: bool = True
    ppo_epochs: int = 1  # passes over each step's samples
    minibatches: int = 1  # optimizer steps per pass
    max_bad_steps: int = 5  # stop after this many non-finite losses in a row


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
class PipelineConfig:
    # sync: one process, generate then train; async: engine and learner overlap
    mode: Literal["sync", "async"] = "sync"
    # async workers: threads of this process (one machine), Ray actors (a cluster), or serially (debugging)
    backend: Literal["ray", "threads", "local"] = "threads"
    max_staleness: int | Literal["auto"] = 0  # k: trained-on tokens are at most k versions old; auto adapts k
    staleness_min: int = 0  # auto: lower bound of k
    staleness_max: int = 4  # auto: upper bound of k
    auto_low: float = 0.002  # auto: grow k while the behaviour-vs-learner KL stays below this
    auto_high: float = 0.01  # auto: shrink k when the KL goes above this
    # tokens beyond k: drop their sample, keep them as context only (mask), or train on them (keep: k bounds
    # admission only, as APRIL's partial rollouts, which resume a sample across updates and train it whole)
    stale: Literal["drop", "mask", "keep"] = "drop"
    # when new weights reach the engines: drain (after they finish what they hold), inflight (between decode
    # steps, PipelineRL), cut_resume (cut every request, resume each from its prefix, APRIL)
    weight_sync: str = "drain"
    # what an update trains on: wave (exactly its own data-scheduler batch, in order), partial (the oldest
    # complete groups; unfinished ones carry over, APRIL partial rollouts)
    consumption: str = "wave"
    overprovision: float = 1.0  # consumption partial: samples in flight per update, x a step's samples
    engine_chunk_steps: int = 8  # engine steps per call between the loop's bookkeeping
    ray_address: str | None = None  # join this Ray cluster; None starts a local one
    num_engines: int = 1  # engine workers; groups go to the one holding the fewest requests
    engine_cpus: int = 1  # cores (and torch threads) of each engine actor
    learner_cpus: int = 1  # cores (and torch threads) of the learner actor
    # a worker that answers no call (async) or a phase of a step that does not end (sync) for this long is
    # stuck: named with its stack; a stuck engine actor is replaced (Ray), anything else stops the run
    # (the last checkpoint resumes it); 0: wait forever
    worker_timeout_s: float = 600.0


@dataclass
class RolloutConfig:
    """Rollout features of the synchronous loop (`schedrl.rollout.step`)."""

    # SPEC-RL: a task's last rollout drafts its next one, verified by the current policy
    speculative: bool = False
    draft_versions: int = 4  # a draft at most N versions older than the policy is used; older ones are not
    prune_keep: int = 0  # ARRoL: prune each group online to this many samples (0: off; < sampling.group_size)
    prune_success_frac: float = 0.5  # share of predicted successes among the kept samples
    prune_check_tokens: int = 4  # output tokens every running member needs before its group is judged
    # pruned samples: dropped from the loss, or kept (partial text)
    prune_mode: Literal["drop", "keep"] = "drop"


@dataclass
class DataConfig:
    scheduler: str = "uniform"  # data scheduler: which tasks each step trains on, how many samples each
    args: dict[str, Any] = field(default_factory=dict)  # its arguments, e.g. {pool_size: 512}


@dataclass
class LoggingConfig:
    # where metrics are mirrored besides metrics.jsonl (always written): tensorboard, wandb, mlflow
    backends: tuple[str, ...] = ("jsonl", "tensorboard")
    project: str = "schedrl"  # W&B project / MLflow experiment
    wandb_mode: str | None = None  # online, offline or disabled; None: W&B's own default (WANDB_MODE)
    mlflow_tracking_uri: str | None = None  # None: a file store in the run directory (mlruns/)


@dataclass
class RunConfig:
    seed: int = 0  # seeds data, sampling and initialisation
    steps: int = 300  # RL training steps
    out_dir: str = "runs"  # parent of run directories
    name: str | None = None  # run directory name; None = task name + timestamp
    save_every: int = 50  # checkpoint every N steps; 0 only at the end
    keep_last: int = 3  # checkpoints kept; older ones are deleted once a newer one is complete
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
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


# Fields that must be > 0 or >= 0, by dotted name.
_POSITIVE = {
    "steps",
    "keep_last",
    "task.max_turns",
    "task.max_observation_tokens",
    "task.env_timeout_s",
    "sampling.prompts_per_step",
    "sampling.group_size",
    "sampling.max_new_tokens",
    "engine.max_concurrency",
    "engine.max_batched_tokens",
    "optim.lr",
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
    "algo.clip_eps",
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


def _convert(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against annotation `tp`; return it converted (int -> float, list -> tuple)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    bad = ConfigError(f"config field '{where}' must be {_type_name(tp)}, got {value!r}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"config field '{where}' must be a mapping, got {value!r}")
        return _build(tp, value, where + ".")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(value, arg, where)
            except ConfigError:
                continue
        raise bad
    if origin is Literal:
        if value not in args:
            raise ConfigError(
                f"config field '{where}' must be one of {', '.join(map(repr, args))}, got {value!r}"
            )
        return value
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        if not isinstance(value, list | tuple):
            raise bad
        return tuple(_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if origin is tuple:
        if not isinstance(value, list | tuple) or len(value) != len(args):
            raise bad
        return tuple(
            _convert(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True))
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


# Keys that were replaced, with what replaces them.
_MOVED = {
    "pipeline.inflight_weight_updates": "pipeline.weight_sync: inflight (true) or drain (false)",
    "engine.share_prompts": "engine.prefill_prompt_once (the engine prefills a group's prompt once)",
    "optim.share_prompts": "optim.forward_prompt_once (the learner forwards a group's prompt once)",
    "pipeline.partial_rollouts": "pipeline.consumption: partial with pipeline.weight_sync: cut_resume (true, "
    "without in-flight updates), or consumption: wave (false)",
}


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if prefix + key in _MOVED:
            raise ConfigError(f"config key '{prefix}{key}' was replaced: use {_MOVED[prefix + key]}")
        if key not in hints:
            raise ConfigError(f"unknown config key '{prefix}{key}'; valid keys here: {', '.join(names)}")
    return cls(**{k: _convert(v, hints[k], prefix + k) for k, v in data.items()})


def _validate(cfg: RunConfig) -> None:
    for dotted in _POSITIVE | _NON_NEGATIVE:
        obj: Any = cfg
        for part in dotted.split("."):
            obj = getattr(obj, part)
        if dotted in _POSITIVE and obj <= 0:
            raise ConfigError(f"config field '{dotted}' must be > 0, got {obj!r}")
        if dotted in _NON_NEGATIVE and obj < 0:
            raise ConfigError(f"config field '{dotted}' must be >= 0, got {obj!r}")
    _validate_pipeline(cfg.pipeline, cfg.algo)
    _validate_admission(cfg.engine)
    _validate_backend(cfg)
    _validate_data(cfg)
    _validate_rollout(cfg)
    known = ("jsonl", "tensorboard", "wandb", "mlflow")
    for name in cfg.logging.backends:
        if name not in known:
            raise ConfigError(f"config field 'logging.backends' has {name!r}; known: {', '.join(known)}")
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


def _validate_admission(e: EngineSection) -> None:
    from schedrl.rollout.registry import ADMISSION, make_admission

    if e.admission not in ADMISSION:
        raise ConfigError(
            f"config field 'engine.admission' must be one of {', '.join(ADMISSION.names())}, "
            f"got {e.admission!r}"
        )
    try:
        make_admission(e.admission, **e.admission_args)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"config field 'engine.admission_args' ({e.admission_args!r}): {err}") from None


def _validate_backend(cfg: RunConfig) -> None:
    """`engine.backend` and `engine.vllm`: vLLM's settings are checked against vLLM where it is installed."""
    e = cfg.engine
    if e.backend not in ("builtin", "vllm"):
        raise ConfigError(f"config field 'engine.backend' must be builtin or vllm, got {e.backend!r}")
    if e.backend != "vllm":
        if e.vllm:
            raise ConfigError(
                f"config field 'engine.vllm' ({', '.join(sorted(e.vllm))}) is set but engine.backend is "
                f"{e.backend!r}; set engine.backend: vllm"
            )
        return
    from schedrl.engine.vllm_engine import check_vllm_args

    if e.park_slots > 0 or cfg.task.tool_wait == "pin":
        raise ConfigError(
            "engine.backend: vllm does not park trajectories (engine.park_slots, task.tool_wait: pin); its "
            "prefix cache keeps a finished turn's blocks by itself: use task.tool_wait: release or priority"
        )
    try:
        check_vllm_args(e.vllm)
    except ImportError:
        pass  # without vllm the settings are checked when the engine starts (and the error names the extra)
    except ValueError as err:
        raise ConfigError(f"config field {err}") from None


def _validate_data(cfg: RunConfig) -> None:
    from schedrl.data import SCHEDULERS, DataContext, make_scheduler
    from schedrl.envs import TaskSource

    d = cfg.data
    if d.scheduler not in SCHEDULERS:
        raise ConfigError(
            f"config field 'data.scheduler' must be one of {', '.join(sorted(SCHEDULERS))}, "
            f"got {d.scheduler!r}"
        )
    # builds nothing heavy: a scheduler reads its task source only when first asked for a batch
    ctx = DataContext(typing.cast("TaskSource", None), cfg.seed, cfg.sampling.group_size, cfg.steps)
    try:
        make_scheduler(d.scheduler, ctx, **d.args)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"config field 'data.args' ({d.args!r}): {err}") from None


def _validate_rollout(cfg: RunConfig) -> None:
    from schedrl.envs.registry import ENVIRONMENTS

    if cfg.task.env not in ENVIRONMENTS and ":" not in cfg.task.env:
        raise ConfigError(
            f"config field 'task.env' must be one of {', '.join(ENVIRONMENTS.names())} or a dotted path "
            f"'pkg.module:Env', got {cfg.task.env!r}"
        )
    r = cfg.rollout
    if r.draft_versions <= 0:
        raise ConfigError(f"config field 'rollout.draft_versions' must be > 0, got {r.draft_versions!r}")
    if r.prune_keep and not 2 <= r.prune_keep < cfg.sampling.group_size:
        raise ConfigError(
            f"config field 'rollout.prune_keep' must be 0 (off) or in [2, sampling.group_size="
            f"{cfg.sampling.group_size}), got {r.prune_keep!r}"
        )
    if not 0 <= r.prune_success_frac <= 1:
        raise ConfigError(
            f"config field 'rollout.prune_success_frac' must be in [0, 1], got {r.prune_success_frac!r}"
        )
    if r.prune_check_tokens <= 0:
        raise ConfigError(
            f"config field 'rollout.prune_check_tokens' must be > 0, got {r.prune_check_tokens!r}"
        )
    from schedrl.algos.turn_credit import TURN_CREDITS

    if cfg.algo.turn_credit not in TURN_CREDITS:
        raise ConfigError(
            f"config field 'algo.turn_credit' must be one of {', '.join(TURN_CREDITS)}, "
            f"got {cfg.algo.turn_credit!r}"
        )
    if not 0.0 <= cfg.algo.turn_discount <= 1.0:
        raise ConfigError(
            f"config field 'algo.turn_discount' must be in [0, 1], got {cfg.algo.turn_discount!r}"
        )
    if cfg.algo.turn_credit == "return_to_go" and cfg.algo.advantage != "grpo":
        raise ConfigError(
            "config field 'algo.turn_credit' is 'return_to_go': it replaces the group advantage with one per "
            f"turn and needs algo.advantage 'grpo', got {cfg.algo.advantage!r}"
        )
    if cfg.task.max_env_error_rate > 1:
        raise ConfigError(
            f"config field 'task.max_env_error_rate' must be in [0, 1], got {cfg.task.max_env_error_rate!r}"
        )
    if cfg.task.max_turn_tokens is not None and cfg.task.max_turn_tokens <= 0:
        raise ConfigError(
            f"config field 'task.max_turn_tokens' must be > 0, got {cfg.task.max_turn_tokens!r}"
        )
    from schedrl.rollout.tool_wait import make_tool_wait

    try:
        make_tool_wait(cfg.task.tool_wait, **cfg.task.tool_wait_args)
    except ValueError as e:
        raise ConfigError(f"config field 'task.tool_wait': {e}") from None
    on = [f"rollout.{n}" for n in ("speculative", "prune_keep") if getattr(r, n)]
    if cfg.task.env != "single_turn" and on:
        raise ConfigError(
            f"config field 'task.env' is {cfg.task.env!r}: multi-turn episodes run without speculative "
            f"reuse or pruning (they verify or prune single completions); got {on[0]}"
        )
    if len(on) == 2:
        raise ConfigError(
            "config fields 'rollout.speculative' and 'rollout.prune_keep' cannot both be on: a "
            "group's drafts would finish outside the pruner's view"
        )
    if on and cfg.pipeline.mode == "async":
        raise ConfigError(
            f"config field '{on[0]}' works in the synchronous loop only (pipeline.mode: sync), "
            "got pipeline.mode 'async'"
        )


def _validate_pipeline(p: PipelineConfig, algo: AlgoConfig) -> None:
    from schedrl.orchestrate.consumption import CONSUMPTION
    from schedrl.orchestrate.weight_sync import WEIGHT_SYNC

    for name, registry in (("weight_sync", WEIGHT_SYNC), ("consumption", CONSUMPTION)):
        if getattr(p, name) not in registry:
            raise ConfigError(
                f"config field 'pipeline.{name}' must be one of {', '.join(registry.names())}, "
                f"got {getattr(p, name)!r}"
            )
    off_policy = (
        p.max_staleness != 0
        or WEIGHT_SYNC.get(p.weight_sync).off_policy
        or CONSUMPTION.get(p.consumption).off_policy
    )
    if p.mode == "async" and off_policy and algo.correction == "none":
        raise ConfigError(
            "config field 'algo.correction' is 'none', but pipeline settings (max_staleness="
            f"{p.max_staleness!r}, weight_sync={p.weight_sync!r}, consumption={p.consumption!r}) train on "
            "tokens from older weights; choose 'decoupled', 'tis' or 'cross_stage' so they are corrected"
        )
    if p.max_staleness != "auto" and p.max_staleness < 0:
        raise ConfigError(
            f"config field 'pipeline.max_staleness' must be >= 0 or 'auto', got {p.max_staleness!r}"
        )
    if not 0 <= p.staleness_min <= p.staleness_max:
        raise ConfigError(
            f"config fields 'pipeline.staleness_min' and 'pipeline.staleness_max' need "
            f"0 <= min <= max, got {p.staleness_min!r} and {p.staleness_max!r}"
        )
    if not 0 <= p.auto_low < p.auto_high:
        raise ConfigError(
            f"config fields 'pipeline.auto_low' and 'pipeline.auto_high' need 0 <= low < high, "
            f"got {p.auto_low!r} and {p.auto_high!r}"
        )
    if p.overprovision < 1:
        raise ConfigError(f"config field 'pipeline.overprovision' must be >= 1, got {p.overprovision!r}")
    for name in ("engine_chunk_steps", "num_engines", "engine_cpus", "learner_cpus"):
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


def build_dataclass(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """`cls` (a config dataclass, sections nested) from a mapping: every key known and typed, or a
    `ConfigError` naming the dotted field and the bad value."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"config{' ' + prefix.rstrip('.') if prefix else ''} must be a mapping, got {data!r}"
        )
    return _build(cls, data, prefix)


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
    return data


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
