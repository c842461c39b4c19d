"""A parsed `RunConfig` checked against what it names: policies, environments, the engine backend.

`schedrl.config` parses and checks what a record alone can tell; this module asks the registries
(each policy's own `Args`, the rules between policies that the policies state) and runs before a run
directory exists. It loads nothing: no model, tokenizer, checkpoint or task data.
"""

from __future__ import annotations

import os

import torch

from schedrl.algos.loss_call import loss_call
from schedrl.algos.registry import ADVANTAGES
from schedrl.algos.turn_credit import TURN_CREDITS
from schedrl.config import ConfigError, RunConfig
from schedrl.distributed.backend import WORKER_BACKENDS
from schedrl.engine.registry import ENGINES
from schedrl.envs.registry import ENVIRONMENTS
from schedrl.orchestrate.schedule import Run, check_schedule
from schedrl.rewards.judge import wants_policy_judge
from schedrl.training.loggers import JSONL, LOGGERS


def check_run(cfg: RunConfig) -> RunConfig:
    """`cfg`, or a `ConfigError` naming the field, the policy or the value that cannot run."""
    t, e = cfg.task, cfg.engine
    if t.env not in ENVIRONMENTS:
        raise ConfigError(
            f"config field 'task.env' must be one of {', '.join(ENVIRONMENTS.names())} or a dotted path "
            f"'pkg.module:Env', got {t.env!r}"
        )
    try:
        engine = ENGINES.get(e.backend)
    except ValueError as err:
        raise ConfigError(f"config field 'engine.backend': {err}") from None
    try:
        engine.check(e.vllm)
    except ValueError as err:  # the message names the setting, quoted
        raise ConfigError(f"config field {err}") from None
    features = frozenset(getattr(engine, "features", ()))
    if e.park_slots > 0 and "park_slots" not in features:
        raise ConfigError(
            f"config field 'engine.park_slots': engine backend {e.backend!r} has no parking slots "
            f"(features: {', '.join(sorted(features)) or 'none'}); it parks in its own KV cache"
        )
    try:
        loss_call(cfg.algo)  # the loss, algo.loss_args against its Args, the loss under the rest of algo
        ADVANTAGES.get(cfg.algo.advantage)
    except ValueError as err:
        raise ConfigError(f"config field 'algo': {err}") from None
    if cfg.algo.turn_credit not in TURN_CREDITS:
        raise ConfigError(
            f"config field 'algo.turn_credit' must be one of {', '.join(TURN_CREDITS)}, "
            f"got {cfg.algo.turn_credit!r}"
        )
    if cfg.algo.task_normalize and cfg.algo.turn_credit != "broadcast":
        raise ConfigError(
            "config field 'algo.task_normalize' standardises one advantage per sample by task type; "
            f"algo.turn_credit {cfg.algo.turn_credit!r} gives one per turn: use broadcast"
        )
    if cfg.algo.turn_credit == "return_to_go" and cfg.algo.advantage != "grpo":
        raise ConfigError(
            "config field 'algo.turn_credit' is 'return_to_go': it replaces the group advantage with one per "
            f"turn and needs algo.advantage 'grpo', got {cfg.algo.advantage!r}"
        )
    if cfg.pipeline.backend not in WORKER_BACKENDS:
        raise ConfigError(
            f"config field 'pipeline.backend' must be one of {', '.join(WORKER_BACKENDS.names())} or a "
            f"dotted path 'pkg.module:Backend', got {cfg.pipeline.backend!r}"
        )
    known = [JSONL, *LOGGERS.names()]
    for name in cfg.logging.backends:
        if name not in known and ":" not in name:
            raise ConfigError(f"config field 'logging.backends' has {name!r}; known: {', '.join(known)}")
    run = Run(
        asynchronous=cfg.pipeline.mode == "async",
        multi_turn=t.env != "single_turn",
        engine_features=features,
        engine=e.backend,
        corrected=cfg.algo.correction != "none",
        group_size=cfg.sampling.group_size,
    )
    check_schedule(cfg.schedule, run)
    if cfg.schedule.migrate and (cfg.pipeline.mode != "async" or cfg.pipeline.num_engines < 2):
        raise ConfigError(
            "config field 'schedule.migrate' moves requests between engines: it needs pipeline.mode "
            f"'async' and pipeline.num_engines >= 2, got {cfg.pipeline.mode!r} with "
            f"{cfg.pipeline.num_engines} engine(s)"
        )
    check_learner(cfg)
    if cfg.pipeline.reward_placement == "separate" and cfg.pipeline.mode != "async":
        raise ConfigError(
            "config field 'pipeline.reward_placement' 'separate' runs a reward worker beside the engines: it "
            f"needs pipeline.mode 'async' (schedule.max_staleness 0 keeps it synchronous), got {cfg.pipeline.mode!r}"
        )
    on_engine = cfg.pipeline.mode != "async" or cfg.pipeline.reward_placement == "colocated"
    if wants_policy_judge(t.reward_model, t.args) and not (on_engine and e.backend == "builtin"):
        raise ConfigError(
            "config field 'task.reward_model' (or task.args.reward) has judge 'policy': the policy judges "
            "its samples on the engine that generated them, which needs engine.backend 'builtin' and, in "
            f"pipeline.mode 'async', pipeline.reward_placement 'colocated'; got {e.backend!r}, "
            f"{cfg.pipeline.mode!r}, {cfg.pipeline.reward_placement!r}"
        )
    if cfg.schedule.migrate and run.multi_turn:
        raise ConfigError(
            f"config field 'schedule.migrate' cannot run with task.env {t.env!r}: an episode's turns and "
            "tool state live in its engine worker and are discarded when it is cut, so it cannot move"
        )
    return cfg


def check_learner(cfg: RunConfig) -> None:
    """`learner.parallel` and `learner.ranks` against the loop and the machine."""
    lr = cfg.learner
    if lr.ranks > 1 and lr.parallel == "none":
        raise ConfigError(
            f"config field 'learner.ranks' is {lr.ranks} with learner.parallel 'none': pick 'ddp' or 'fsdp2' "
            "to train on several ranks"
        )
    if lr.parallel != "none" and cfg.pipeline.mode != "async":
        raise ConfigError(
            f"config field 'learner.parallel' {lr.parallel!r} runs the learner as worker processes, which "
            "the asynchronous pipeline starts: set pipeline.mode 'async' (with schedule.max_staleness 0, the "
            "default, it trains exactly as the synchronous loop)"
        )
    if lr.lora is not None:
        check_lora(cfg)
    nodes = [f for f in ("engine_node", "learner_node") if getattr(cfg.pipeline, f)]
    if nodes and cfg.pipeline.backend != "ray":
        raise ConfigError(
            f"config field 'pipeline.{nodes[0]}' places workers on a labelled Ray node: it needs "
            f"pipeline.backend 'ray', got {cfg.pipeline.backend!r}"
        )
    available = available_ranks()
    if lr.ranks > available and not cfg.pipeline.ray_address:  # a cluster's CPUs are its own to count
        raise ConfigError(
            f"config field 'learner.ranks' is {lr.ranks}, more than the {available} "
            f"{'GPUs' if torch.cuda.is_available() else 'CPU cores'} this machine gives the run"
        )


def check_lora(cfg: RunConfig) -> None:
    from schedrl.training.lora import lora_spec

    try:
        lora_spec(cfg.learner.lora or {})
    except ValueError as err:
        raise ConfigError(f"config field 'learner.lora': {err}") from None
    if cfg.pipeline.mode != "async":
        raise ConfigError(
            "config field 'learner.lora' trains adapters in the learner worker, which the asynchronous "
            "pipeline starts: set pipeline.mode 'async' (with schedule.max_staleness 0, the default, it "
            "trains exactly as the synchronous loop)"
        )


def available_ranks() -> int:
    """Learner ranks this machine can hold: its GPUs, else the cores this process may use."""
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
