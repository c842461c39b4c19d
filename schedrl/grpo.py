"""TRL's `GRPOConfig` and `GRPOTrainer` on schedrl: a TRL GRPO script ports by its import line.

    from schedrl import GRPOConfig, GRPOTrainer        # was: from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir="runs/grpo", num_generations=8, learning_rate=1e-6, max_steps=300)
    trainer = GRPOTrainer(model="path/to/model", reward_funcs=[correct, brief], args=args,
                          train_dataset=dataset)
    trainer.train()
    trainer.save_model()

`GRPOConfig` has TRL 1.16's field names and defaults, and `to_config` maps them onto a schedrl run
config (the table is in the docs page for TRL users). Nothing is silently ignored: a field that is not
here is a `TypeError` naming it, and a field at a value schedrl cannot honour is a `ConfigError` naming
the field and the value. Fields that cannot change what is trained (display, data loading) are accepted.

TRL counts steps in optimizer steps and batches in completions: `per_device_train_batch_size` completions
per forward, `gradient_accumulation_steps` of them per optimizer step, `steps_per_generation` of those
per generation round. schedrl counts RL steps (one generation round each) and prompts: a round generates
`prompts_per_step = generation_batch_size / num_generations` groups of `num_generations` samples and takes
`minibatches * ppo_epochs` optimizer steps on them, so `steps = max_steps / (minibatches * ppo_epochs)`.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from schedrl.api import Result, Trainer
from schedrl.config import ConfigError

# TRL loss_type -> (schedrl loss, how token losses are averaged); "bnpo" needs one micro-batch per update
LOSS_TYPES = {
    "grpo": ("grpo", "seq_mean"),
    "dapo": ("grpo", "token_mean"),
    "bnpo": ("grpo", "token_mean"),
    "dr_grpo": ("drgrpo", "token_mean"),
}
SCHEDULERS = {
    "constant": "constant",
    "constant_with_warmup": "warmup",
    "linear": "linear",
    "cosine": "cosine",
}
LOGGERS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused")  # schedrl fuses AdamW where every parameter allows


def _refuse(name: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"GRPOConfig field '{name}' = {value!r}: {why}")


@dataclass(kw_only=True)
class GRPOConfig:
    """TRL's `GRPOConfig` fields that schedrl maps (defaults are TRL 1.16's); see the module docstring."""

    # where the run lands: the run directory itself (its parent is schedrl's out_dir, its name the run's)
    output_dir: str | None = None
    seed: int = 42
    # batch shape, in completions (TRL's convention)
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    steps_per_generation: int | None = None  # None: gradient_accumulation_steps
    generation_batch_size: int | None = None  # completions per generation round; or steps_per_generation
    num_generations: int = 8  # samples per prompt (G)
    num_generations_eval: int | None = None  # samples per held-out prompt (pass@k's k); None: num_generations
    max_steps: int = -1  # optimizer steps; -1: num_train_epochs over the train dataset
    num_train_epochs: float = 3.0
    num_iterations: int = 1  # optimizer passes over each generation round (schedrl's ppo_epochs)
    # sampling
    max_completion_length: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    # optimizer
    learning_rate: float = 1e-6
    lr_scheduler_type: str = "linear"
    lr_scheduler_kwargs: dict[str, Any] | None = None
    warmup_steps: float = 0  # steps, or a fraction of the run below 1
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    optim: str = "adamw_torch_fused"
    gradient_checkpointing: bool = True
    bf16: bool | None = None  # None: bfloat16 on a GPU, float32 on a CPU (schedrl's auto)
    fp16: bool = False
    use_cpu: bool = False
    # the loss
    loss_type: str = "dapo"
    beta: float = 0.0  # KL coefficient (k3 estimator, to the initial policy)
    epsilon: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    importance_sampling_level: str = "token"
    scale_rewards: str | bool = "group"
    reward_weights: list[float] | None = None
    multi_objective_aggregation: str = "sum_then_normalize"
    entropy_coef: float = 0.0
    top_entropy_quantile: float = 1.0
    mask_truncated_completions: bool = False
    use_bias_correction_kl: bool = True
    # logging, saving, evaluation
    logging_steps: float = 10
    logging_strategy: str = "steps"
    report_to: str | list[str] | None = None  # None or "none": metrics.jsonl only
    run_name: str | None = None
    save_strategy: str = "steps"
    save_steps: float = 500
    save_total_limit: int | None = None
    eval_strategy: str = "no"
    eval_steps: float | None = None
    # accepted at any value: they change how TRL loads data or shows progress, not what is trained
    per_device_eval_batch_size: int = 8
    dataloader_num_workers: int = 0
    disable_tqdm: bool | None = None
    log_level: str = "passive"
    remove_unused_columns: bool = False
    # accepted at TRL's default only
    use_vllm: bool = False
    shuffle_dataset: bool = True
    disable_dropout: bool = False
    model_init_kwargs: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    generation_kwargs: dict[str, Any] | None = None
    log_completions: bool = False
    push_to_hub: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # schedrl fields on top, e.g. {"sft": {"steps": 30}}

    def __post_init__(self) -> None:
        at_default = (
            ("use_vllm", "set engine.backend: vllm in `extra` (schedrl's vLLM engine)"),
            ("shuffle_dataset", "schedrl's data scheduler draws tasks at random"),
            ("disable_dropout", "not supported"),
            ("model_init_kwargs", "load the model yourself and pass the object"),
            ("chat_template_kwargs", "not supported"),
            ("generation_kwargs", "not supported: set temperature, top_p and top_k"),
            ("log_completions", "not supported: the run report shows sample completions"),
            ("push_to_hub", "schedrl works offline"),
            ("min_p", "not supported"),
            ("repetition_penalty", "not supported"),
            ("lr_scheduler_kwargs", "not supported"),
            ("delta", "INTELLECT-2's two-sided clip is not supported"),
            ("fp16", "use bf16"),
            ("mask_truncated_completions", "not supported"),
            ("top_entropy_quantile", "not supported"),
        )
        defaults = {f.name: f.default for f in fields(self)}
        for name, why in at_default:
            value = getattr(self, name)
            if value != defaults[name] and not (value == {} and defaults[name] is None):
                raise _refuse(name, value, why)

    def batch_shape(self) -> tuple[int, int]:
        """(prompts per generation round, optimizer steps per round per pass) from TRL's batch fields."""
        pdtbs, gas, g = (
            self.per_device_train_batch_size,
            self.gradient_accumulation_steps,
            self.num_generations,
        )
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations"):
            if getattr(self, name) < 1:
                raise _refuse(name, getattr(self, name), "must be >= 1")
        if self.generation_batch_size is not None and self.steps_per_generation is not None:
            raise ConfigError("GRPOConfig: give generation_batch_size or steps_per_generation, not both")
        if self.generation_batch_size is not None:
            if self.generation_batch_size % pdtbs:
                raise _refuse(
                    "generation_batch_size", self.generation_batch_size, f"not a multiple of {pdtbs=}"
                )
            spg = self.generation_batch_size // pdtbs
        else:
            spg = self.steps_per_generation or gas
        if spg % gas:
            raise _refuse(
                "steps_per_generation", spg, f"not a multiple of gradient_accumulation_steps ({gas})"
            )
        if (pdtbs * spg) % g:
            raise _refuse(
                "num_generations", g, f"must divide the generation batch ({pdtbs * spg} completions)"
            )
        return pdtbs * spg // g, spg // gas

    def to_config(self, train_rows: int | None = None, eval_rows: int | None = None) -> dict[str, Any]:
        """The schedrl run config (a dict for `schedrl.train`); `train_rows` sizes an epoch-counted run,
        `eval_rows` the held-out evaluation (None or 0: no evaluation, as TRL without an eval dataset)."""
        prompts, minibatches = self.batch_shape()
        epochs = self.num_iterations
        if epochs < 1:
            raise _refuse("num_iterations", epochs, "must be >= 1")
        per_round = minibatches * epochs  # optimizer steps per schedrl step
        steps = self._steps(prompts, per_round, train_rows)
        algo = self._algo(minibatches)
        out = Path(self.output_dir or "trainer_output")
        if self.run_name is not None and self.run_name != out.name:
            raise _refuse("run_name", self.run_name, f"schedrl names a run by its directory ({out.name!r})")
        warmup = self.warmup_steps if self.warmup_steps >= 1 else math.ceil(self.warmup_steps * steps)
        if self.lr_scheduler_type not in SCHEDULERS:
            raise _refuse("lr_scheduler_type", self.lr_scheduler_type, f"valid: {', '.join(SCHEDULERS)}")
        if self.optim not in OPTIMIZERS:
            raise _refuse("optim", self.optim, f"valid: {', '.join(OPTIMIZERS)}")
        if self.adam_epsilon != 1e-8:
            raise _refuse("adam_epsilon", self.adam_epsilon, "schedrl's AdamW uses 1e-8")
        if self.use_cpu:
            import torch

            if torch.cuda.is_available():
                raise _refuse("use_cpu", True, "hide the GPU instead: CUDA_VISIBLE_DEVICES=''")
        config: dict[str, Any] = {
            "seed": self.seed,
            "steps": steps,
            "out_dir": str(out.parent),
            "name": out.name,
            "model": {"dtype": {None: "auto", True: "bfloat16", False: "float32"}[self.bf16]},
            "sampling": {
                "prompts_per_step": prompts,
                "group_size": self.num_generations,
                "max_new_tokens": self.max_completion_length,
                "temperature": self.temperature,
                "top_p": self.top_p,
                "top_k": self.top_k,
            },
            "algo": algo,
            "optim": {
                "lr": self.learning_rate,
                "schedule": SCHEDULERS[self.lr_scheduler_type],
                "warmup_steps": int(warmup),
                "weight_decay": self.weight_decay,
                "betas": [self.adam_beta1, self.adam_beta2],
                "max_grad_norm": self.max_grad_norm,
                "micro_batch_size": self.per_device_train_batch_size,
                "micro_batch_tokens": 0,  # TRL's micro-batches are counted in rows only
                "ppo_epochs": epochs,
                "minibatches": minibatches,
                "gradient_checkpointing": self.gradient_checkpointing,
            },
            "sft": {"steps": 0},
            "eval": self._eval(steps, per_round, eval_rows),
            "logging": self._logging(steps, per_round),
            **self._saving(steps, per_round),
        }
        from schedrl.api import merge_overrides

        return merge_overrides(config, self.extra)

    def _steps(self, prompts: int, per_round: int, train_rows: int | None) -> int:
        if self.max_steps > 0:
            if self.max_steps % per_round:
                raise _refuse(
                    "max_steps",
                    self.max_steps,
                    f"not a multiple of the optimizer steps per round ({per_round})",
                )
            return self.max_steps // per_round
        if train_rows is None:
            raise ConfigError(
                "GRPOConfig: max_steps = -1 counts epochs, which needs the train dataset's size"
            )
        return max(1, math.ceil(self.num_train_epochs * train_rows / prompts))

    def _algo(self, minibatches: int) -> dict[str, Any]:
        if self.loss_type not in LOSS_TYPES:
            raise _refuse("loss_type", self.loss_type, f"valid: {', '.join(LOSS_TYPES)}")
        if self.loss_type == "bnpo" and (minibatches > 1 or self.gradient_accumulation_steps > 1):
            raise _refuse("loss_type", "bnpo", "normalises per micro-batch; with accumulation use 'dapo'")
        loss, agg = LOSS_TYPES[self.loss_type]
        if self.importance_sampling_level == "sequence":
            if self.loss_type == "dr_grpo":
                raise _refuse("importance_sampling_level", "sequence", "not with loss_type 'dr_grpo'")
            loss = "gspo"
        elif self.importance_sampling_level != "token":
            raise _refuse(
                "importance_sampling_level", self.importance_sampling_level, "valid: token, sequence"
            )
        scale = {True: "group", False: "none"}.get(self.scale_rewards, self.scale_rewards)  # type: ignore[arg-type]
        if scale not in ("group", "batch", "none"):
            raise _refuse("scale_rewards", self.scale_rewards, "valid: group, batch, none")
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise _refuse(
                "multi_objective_aggregation", self.multi_objective_aggregation, "valid: sum_then_normalize"
            )
        if self.beta > 0 and self.use_bias_correction_kl:
            raise _refuse(
                "use_bias_correction_kl",
                True,
                "schedrl's KL term is the plain k3 estimate: set use_bias_correction_kl=False with beta > 0",
            )
        return {
            "loss": loss,
            "loss_args": {"clip_eps": self.epsilon, "clip_eps_high": self.epsilon_high},
            "loss_agg": agg,
            "advantage": "lite_ppo" if scale == "batch" else "grpo",
            "std_normalize": scale != "none",
            "kl_coef": self.beta,
            "kl_estimator": "k3",
            "entropy_coef": self.entropy_coef,
        }

    def _eval(self, steps: int, per_round: int, eval_rows: int | None) -> dict[str, Any]:
        every = 0
        if self.eval_strategy == "steps":
            every = self._every("eval_steps", self.eval_steps or self.logging_steps, steps, per_round)
        elif self.eval_strategy != "no":
            raise _refuse("eval_strategy", self.eval_strategy, "valid: no, steps")
        return {
            "tasks": eval_rows or 0,
            "k": self.num_generations_eval or self.num_generations,
            "every": every,
        }

    def _logging(self, steps: int, per_round: int) -> dict[str, Any]:
        if self.logging_strategy != "steps":
            raise _refuse(
                "logging_strategy", self.logging_strategy, "valid: steps (metrics.jsonl has every step)"
            )
        names = [self.report_to] if isinstance(self.report_to, str) else list(self.report_to or [])
        names = [n for n in names if n != "none"]
        for name in names:
            if name not in LOGGERS:
                raise _refuse("report_to", name, f"valid: none, {', '.join(LOGGERS)}")
        return {
            "backends": ["jsonl", *(LOGGERS[n] for n in names)],
            "every": self._every("logging_steps", self.logging_steps, steps, per_round),
        }

    def _saving(self, steps: int, per_round: int) -> dict[str, Any]:
        if self.save_strategy == "no":
            every = 0  # schedrl still writes the final checkpoint: resume and save_model read it
        elif self.save_strategy == "steps":
            every = self._every("save_steps", self.save_steps, steps, per_round)
        else:
            raise _refuse("save_strategy", self.save_strategy, "valid: steps, no")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            raise _refuse("save_total_limit", self.save_total_limit, "must be >= 1 or None")
        return {"save_every": every, "keep_last": self.save_total_limit}

    def _every(self, name: str, value: float, steps: int, per_round: int) -> int:
        """An interval in optimizer steps (or a fraction of the run below 1) in schedrl steps, each of
        `per_round` optimizer steps."""
        if value <= 0:
            raise _refuse(name, value, "must be > 0")
        return max(1, math.ceil(value * steps) if value < 1 else round(value / per_round))


class GRPOTrainer(Trainer):
    """TRL's `GRPOTrainer` signature on `schedrl.Trainer`: `model` (a `PreTrainedModel` or a local model
    directory), `reward_funcs`, `args` (a `GRPOConfig`), the datasets and `processing_class`. `train()`
    returns a `schedrl.Result`; `save_model()` copies the trained model to `args.output_dir`."""

    def __init__(
        self,
        model: Any,
        reward_funcs: Callable | Sequence[Callable] | None = None,
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        reward_processing_classes: Any = None,
        callbacks: Any = None,
        optimizers: tuple[Any, Any] = (None, None),
        quantization_config: Any = None,
        peft_config: Any = None,
        tools: Any = None,
        rollout_func: Any = None,
        environment_factory: Any = None,
    ) -> None:
        unsupported = {
            "reward_processing_classes": reward_processing_classes,
            "callbacks": callbacks,
            "quantization_config": quantization_config,
            "peft_config": peft_config,
            "tools": tools,
            "rollout_func": rollout_func,
            "environment_factory": environment_factory,
        }
        for name, value in unsupported.items():
            if value is not None:
                raise TypeError(f"GRPOTrainer: {name} is not supported by schedrl's GRPOTrainer")
        if optimizers != (None, None):
            raise TypeError("GRPOTrainer: optimizers is not supported (schedrl builds AdamW from args)")
        if reward_funcs is None:
            raise ValueError("GRPOTrainer needs reward_funcs: one function or a list of them")
        funcs = list(reward_funcs) if isinstance(reward_funcs, Sequence) else [reward_funcs]
        for fn in funcs:
            if not callable(fn):
                raise TypeError(
                    f"GRPOTrainer: reward function {fn!r} is not callable (reward models by name are not supported)"
                )
        self.args = args if args is not None else GRPOConfig(output_dir="trainer_output")
        if not isinstance(self.args, GRPOConfig):
            raise TypeError(f"GRPOTrainer: args must be schedrl.GRPOConfig, got {type(self.args).__name__}")
        if train_dataset is None:
            raise ValueError("GRPOTrainer needs a train_dataset (a datasets.Dataset or a list of dicts)")
        config = self.args.to_config(len(train_dataset), None if eval_dataset is None else len(eval_dataset))
        super().__init__(
            model,
            processing_class,
            reward_funcs=funcs,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            config=config,
            reward_weights=self.args.reward_weights,
        )
        self.run_dir = Path(config["out_dir"]) / config["name"]

    def train(  # type: ignore[override]
        self, resume_from_checkpoint: str | bool | None = None, on_step: Any = None
    ) -> Result:
        """Run it; `resume_from_checkpoint` True (or the run directory, or its latest checkpoint)
        continues the run in `args.output_dir` from its last checkpoint."""
        resume = None
        if resume_from_checkpoint:
            resume = self.run_dir
            if isinstance(resume_from_checkpoint, str | os.PathLike):
                given = Path(resume_from_checkpoint).resolve()
                from schedrl.training.checkpoint import latest_checkpoint

                latest = latest_checkpoint(self.run_dir / "checkpoints")
                if given != self.run_dir.resolve() and (latest is None or given != latest.resolve()):
                    raise ValueError(
                        f"resume_from_checkpoint={str(resume_from_checkpoint)!r}: schedrl resumes "
                        f"{self.run_dir} from its latest checkpoint ({latest})"
                    )
        return super().train(resume=resume, on_step=on_step)

    def save_model(self, output_dir: str | os.PathLike[str] | None = None) -> Path:
        """Copy the trained model and tokenizer (the last checkpoint's) to `output_dir` (default:
        `args.output_dir`, the run directory)."""
        if self.result is None or self.result.model_path is None:
            raise RuntimeError("GRPOTrainer.save_model: train() has not written a model yet")
        dest = Path(output_dir) if output_dir is not None else self.run_dir
        shutil.copytree(self.result.model_path, dest, dirs_exist_ok=True)
        return dest


__all__ = ["GRPOConfig", "GRPOTrainer"]
