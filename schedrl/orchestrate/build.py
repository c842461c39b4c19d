"""Build a run's components from its config: model, tokenizer, task, engine, learner, logger.

On resume everything is restored from the latest checkpoint (weights, optimizer, LR
schedule, RNG states, step); without one the run starts from the config.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from transformers import PreTrainedModel

from schedrl.config import ConfigError, RunConfig, config_to_dict
from schedrl.data import SCHEDULERS, DataContext, DataScheduler
from schedrl.engine import Engine, EngineConfig
from schedrl.engine.registry import ENGINES
from schedrl.envs import Environment, TaskSource, make_env, make_task
from schedrl.envs.scoring import RewardScorer, reward_delay
from schedrl.models import build_char_tokenizer, build_tiny_model, default_device, load_model_and_tokenizer
from schedrl.models.loading import move_to
from schedrl.models.tiny import preset
from schedrl.orchestrate.schedule import check_reward_delay
from schedrl.rollout.episodes import EpisodeRunner
from schedrl.rollout.folding import Fold
from schedrl.rollout.registry import ADMISSION
from schedrl.rollout.step import StepRollout
from schedrl.rollout.tool_wait import TOOL_WAITS, ToolWaitPolicy
from schedrl.training.checkpoint import latest_checkpoint, load_checkpoint, set_rng_state
from schedrl.training.learner import Learner
from schedrl.training.lora import ADAPTER_DIR, lora_spec
from schedrl.training.parallel import Ranks
from schedrl.training.run_dir import MetricsLogger, RunDir
from schedrl.types import SamplingParams

log = logging.getLogger(__name__)
REF_MODEL_DIR = "ref_model"


def engine_config(cfg: RunConfig) -> EngineConfig:
    """The engine's settings from a run config: its `engine` section, seeded by the run's seed."""
    e = cfg.engine
    return EngineConfig(
        max_concurrency=e.max_concurrency,
        max_batched_tokens=e.max_batched_tokens,
        seed=cfg.seed,
        prefill_prompt_once=e.prefill_prompt_once,
        park_slots=e.park_slots,
        max_model_len=e.max_model_len,
    )


def make_tool_wait_policy(cfg: RunConfig) -> ToolWaitPolicy:
    return TOOL_WAITS.build(cfg.schedule.tool_wait, cfg.schedule.tool_wait_args)


def make_engine(cfg: RunConfig, model: PreTrainedModel, tokenizer: Any, version: int = 0) -> Engine:
    """The run's engine: its `engine` section, with the admission policy it names (`fcfs` becomes
    `priority` when the tool-wait policy orders returning trajectories: it only acts through priorities).

    `engine.backend` picks the engine (`schedrl.engine.registry`): `vllm` starts a `VLLMEngine` on
    `model`'s weights (saved for vLLM to load)."""
    name = cfg.schedule.admission
    if name == "fcfs" and cfg.task.env != "single_turn" and make_tool_wait_policy(cfg).orders_returns:
        name = "priority"
    admission = ADMISSION.build(name, cfg.schedule.admission_args)
    backend = ENGINES.get(cfg.engine.backend)
    lora = lora_spec(cfg.learner.lora) if cfg.learner.lora is not None else None
    keep = cfg.schedule.k_bound + 1  # adapter versions a vLLM engine keeps (and one spare)
    return backend.build(
        model, tokenizer, engine_config(cfg), admission, version, cfg.engine.vllm, lora, keep
    )


@dataclass
class Components:
    cfg: RunConfig
    run: RunDir
    model: PreTrainedModel
    tokenizer: Any
    source: TaskSource
    engine: Engine  # any engine that meets the protocol (HFEngine by default)
    learner: Learner
    scorer: RewardScorer
    logger: MetricsLogger
    start_step: int | None  # None: nothing trained yet (SFT and the first eval come first)
    data: DataScheduler  # picks each step's tasks and group sizes
    state: dict[str, Any] = field(default_factory=dict)  # carried in checkpoints (e.g. eval_before)
    # the synchronous loop's rollout (`build` sets it; the pipeline has none)
    rollout: StepRollout | None = None


def sampling_params(cfg: RunConfig) -> SamplingParams:
    """The sampling parameters of every training request, from the run's `sampling` section."""
    s = cfg.sampling
    return SamplingParams(s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)


def attn_implementation(cfg: RunConfig, device: torch.device) -> str:
    if cfg.model.attn_implementation != "auto":
        return cfg.model.attn_implementation
    return "eager" if device.type == "cpu" else "sdpa"


def load_policy(cfg: RunConfig, path: str | Path | None, device: torch.device) -> tuple[PreTrainedModel, Any]:
    """The policy and its tokenizer: an HF model directory, or the offline tiny model when `path` is None."""
    if path is not None:
        model, tokenizer = load_model_and_tokenizer(path, device)
    else:
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(tokenizer, preset(cfg.model.preset, cfg.model.tiny_seed))
        move_to(model, device)
    model.set_attn_implementation(attn_implementation(cfg, device))
    return model, tokenizer


def make_learner(
    cfg: RunConfig,
    model: PreTrainedModel,
    ref_model: PreTrainedModel | None = None,
    ranks: Ranks | None = None,
    worker: bool = False,
    adapter: Path | None = None,
) -> Learner:
    """The learner of a run, for both loops: the synchronous one and the asynchronous pipeline's worker
    (`worker`: one of `ranks`, on a learner process group; with `learner.lora`, training adapters, from
    those saved in `adapter` on a resume)."""
    lora = lora_spec(cfg.learner.lora) if worker and cfg.learner.lora is not None else None
    return Learner(
        model,
        cfg.optim,
        cfg.algo,
        cfg.steps,
        cfg.sampling.temperature,
        ref_model,
        cfg.seed,
        max_new_tokens=cfg.sampling.max_new_tokens,
        ranks=ranks,
        lora=lora,
        adapter=adapter,
        compute_dtype=compute_dtype(cfg),
    )


def with_reward_model(source: TaskSource, spec: dict[str, Any]) -> TaskSource:
    """`source` rewarded by its rule mixed with the reward model `spec` names (`task.reward_model`)."""
    from schedrl.rewards.mixed import ModelRewarded

    try:
        return cast(TaskSource, ModelRewarded(source, spec))
    except (ValueError, OSError) as err:
        raise ConfigError(f"config field 'task.reward_model': {err}") from None


def compute_dtype(cfg: RunConfig) -> torch.dtype:
    """`learner.compute_dtype` resolved: auto is bfloat16 on a GPU, float32 on a CPU."""
    name = cfg.learner.compute_dtype
    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return getattr(torch, name)


def probe_tol(cfg: RunConfig) -> float:
    """`pipeline.probe_tol` resolved: 1e-3, or 5e-2 where the learner or the engines compute in bfloat16."""
    if cfg.pipeline.probe_tol is not None:
        return cfg.pipeline.probe_tol
    bf16 = compute_dtype(cfg) == torch.bfloat16 or cfg.model.dtype == "bfloat16"
    bf16 = bf16 or (cfg.model.dtype == "auto" and torch.cuda.is_available())
    return 5e-2 if bf16 else 1e-3


def make_episodes(cfg: RunConfig, engine: Engine, tokenizer: Any, source: TaskSource) -> EpisodeRunner | None:
    """The multi-turn episode runner of a task whose `task.env` is not single-turn, else None."""
    t = cfg.task
    if t.env == "single_turn":
        return None

    def new_env() -> Environment:
        return make_env(t.env, source, **t.env_args)

    probe = new_env()  # for its stop strings
    asyncio.run(probe.close())
    cross = None
    if t.cross_policy is not None:
        cross = (other_policy_engine(cfg, t.cross_policy["model"], tokenizer), float(t.cross_policy["p"]))
    return EpisodeRunner(
        engine,
        tokenizer,
        new_env,
        probe.stop_strings,
        t.max_turns,
        t.max_observation_tokens,
        t.env_timeout_s,
        t.max_turn_tokens,
        make_tool_wait_policy(cfg),
        max_error_rate=t.max_env_error_rate,
        fold=Fold(**t.fold) if t.fold is not None else None,
        cross=cross,
    )


def other_policy_engine(cfg: RunConfig, path: str, tokenizer: Any) -> Engine:
    """Cross-policy sampling's engine: the model at `path`, which must share the policy's tokenizer."""
    if not Path(path).is_dir():
        raise ConfigError(f"config field 'task.cross_policy.model': {path!r} is not a model directory")
    model, other = load_policy(cfg, path, default_device())
    if other.get_vocab() != tokenizer.get_vocab():
        raise ConfigError(
            f"config field 'task.cross_policy.model': the tokenizer of {path!r} is not the policy's; "
            "the other policy's tokens go into the policy's history"
        )
    model.eval().requires_grad_(False)
    return make_engine(cfg, model, tokenizer)


def build(cfg: RunConfig, run: RunDir, resume: bool = False, source: TaskSource | None = None) -> Components:
    torch.manual_seed(cfg.seed)
    device = default_device()
    ckpt = latest_checkpoint(run.ckpt_dir) if resume else None
    path = ckpt / "model" if ckpt else cfg.model.path
    if (
        ckpt is not None and (ckpt / ADAPTER_DIR).is_dir()
    ):  # LoRA: the base; the adapters come from the learner
        path = run.root / REF_MODEL_DIR
    source = source if source is not None else make_task(cfg.task.name, **cfg.task.args)
    check_reward_delay(cfg, reward_delay(source))
    model, tokenizer = load_policy(cfg, path, device)
    if cfg.task.reward_model is not None:
        source = with_reward_model(source, cfg.task.reward_model)
    ref_model = None
    if cfg.algo.kl_coef > 0:
        ref_path = run.root / REF_MODEL_DIR
        ref_model = load_policy(cfg, ref_path, device)[0] if ckpt else copy.deepcopy(model)
        ref_model.eval().requires_grad_(False)
    learner = make_learner(cfg, model, ref_model)
    start_step, state = None, {}
    if ckpt is not None:
        state, trainer_state, rng = load_checkpoint(ckpt)
        if cfg.pipeline.mode == "sync":  # asynchronous: the learner worker restores its own state
            learner.load_state_dict(trainer_state, ckpt)
        set_rng_state(rng)
        start_step = state.pop("step")
        log.info("resuming from %s at step %d", ckpt, start_step)
    engine = make_engine(cfg, model, tokenizer, version=start_step or 0)
    scorer = RewardScorer(source, cfg.max_reward_error_rate)
    # Resuming without a checkpoint restarts from scratch: every logged row is dropped.
    logger = MetricsLogger(
        run,
        resume_step=start_step if ckpt else (-1 if resume else None),
        backends=cfg.logging.backends,
        options=dataclasses.asdict(cfg.logging),
        config=config_to_dict(cfg),
        every=cfg.logging.every,
    )
    ctx = DataContext(source, cfg.seed, cfg.sampling.group_size, cfg.steps)
    data = SCHEDULERS.build(cfg.schedule.data, cfg.schedule.data_args, ctx)
    if "data" in state:  # the scheduler's statistics at the checkpoint
        data.load_state_dict(state.pop("data"))
    rollout = StepRollout(cfg, engine, model, tokenizer, make_episodes(cfg, engine, tokenizer, source))
    return Components(
        cfg, run, model, tokenizer, source, engine, learner, scorer, logger, start_step, data, state, rollout
    )


def save_ref_model(c: Components) -> None:
    """The policy RL starts from (after SFT): the KL term's reference, and the base LoRA adapters add to."""
    if c.cfg.learner.lora is not None and c.learner.ref_model is None:
        c.model.save_pretrained(c.run.root / REF_MODEL_DIR)
        c.tokenizer.save_pretrained(c.run.root / REF_MODEL_DIR)
    if c.learner.ref_model is not None:
        c.learner.ref_model.save_pretrained(c.run.root / REF_MODEL_DIR)
        c.tokenizer.save_pretrained(c.run.root / REF_MODEL_DIR)
