"""The Python API: `train` (what `schedrl train` calls) and `Trainer` (objects in, as TRL's trainers).

    import schedrl

    result = schedrl.train("examples/demo.yaml", steps=20)            # a recipe, with overrides
    result = schedrl.train(resume=result.run_dir)                      # continue it from its checkpoint
    result.eval_after["pass@1"], result.metrics[-1]["reward_mean"]

    trainer = schedrl.Trainer(model, tokenizer, reward_funcs=[correct, short], reward_weights=[1, 0.1],
                              train_dataset=dataset, eval_dataset=held_out, config={"steps": 50})
    trainer.train()

Overrides are keywords: top-level fields (`steps=20`), a section as a dict (`optim={"lr": 1e-4}`, merged
into the recipe's), or a dotted field with ``__`` for the dot (`optim__lr=1e-4`). Both write the run
directory themselves (its `config.yaml` first), so a run started here resumes from the command line
too: `schedrl train --resume RUN_DIR`. A `Trainer` run whose reward functions are importable
module-level functions resumes that way as well; one with lambdas or closures resumes through
`Trainer(...).train(resume=RUN_DIR)` with the same objects.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from schedrl.config import (
    ConfigError,
    RunConfig,
    config_from_dict,
    config_to_dict,
    migrate_saved,
    read_recipe,
)

StepCallback = Callable[[int, dict], None]


@dataclass
class Result:
    """What a run gives back: held-out evaluation before and after RL, and where everything is."""

    eval_before: dict[str, float]
    eval_after: dict[str, float]
    run_dir: Path
    plot: Path
    config: Any  # the RunConfig (an LM run) or the ClassicConfig (a classic PPO run)
    seconds: float

    def __str__(self) -> str:
        key = next((k for k in ("pass@1", "mean_return", "reward_mean") if k in self.eval_after), None)
        change = "" if key is None else f"{key} {self.eval_before.get(key, float('nan')):.3f} -> "
        change += "" if key is None else f"{self.eval_after[key]:.3f}, "
        return f"Result({change}{self.seconds:.1f} s, run_dir={str(self.run_dir)!r})"

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """Every logged step of `metrics.jsonl`."""
        from schedrl.training.run_dir import read_metrics

        return read_metrics(self.run_dir / "metrics.jsonl")

    @property
    def model_path(self) -> Path | None:
        """The model directory of the run's last checkpoint (None before the first)."""
        from schedrl.training.checkpoint import latest_checkpoint

        ckpt = latest_checkpoint(self.run_dir / "checkpoints")
        return None if ckpt is None else ckpt / "model"


def _as_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, RunConfig):
        return config_to_dict(config)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):  # a ClassicConfig
        return config_to_dict(config)
    if isinstance(config, Mapping):
        return {k: dict(v) if isinstance(v, Mapping) else v for k, v in config.items()}
    if isinstance(config, str | os.PathLike):
        return read_recipe(Path(config))
    raise ConfigError(f"config must be a path, a dict or a RunConfig, got {type(config).__name__}")


def merge_overrides(data: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`data` with keyword overrides applied: a dict value merges into its section, ``a__b`` is ``a.b``."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for key, value in overrides.items():
        path = key.replace("__", ".").split(".")
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key}: {part!r} is not a section")
        last = path[-1]
        if isinstance(value, Mapping) and isinstance(node.get(last), dict):
            node[last] = {**node[last], **value}
        else:
            node[last] = dict(value) if isinstance(value, Mapping) else value
    return out


def _resolve(build: Callable, config: Any, overrides: Mapping[str, Any] | None, sets: Sequence[str]) -> Any:
    data = merge_overrides(_as_dict(config), overrides or {})
    try:
        return build(data, sets)
    except ConfigError as err:
        if isinstance(config, str | os.PathLike):
            raise ConfigError(f"{config}: {err}") from None
        raise


def resolve_config(
    config: Any = None, overrides: Mapping[str, Any] | None = None, sets: Sequence[str] = ()
) -> RunConfig:
    """The validated config of `config` (a path, dict or RunConfig) with keyword overrides and ``a.b=c``
    overrides (the CLI's --set), checked against the policies it names; an error in a recipe file names
    the file."""
    from schedrl.orchestrate.check import check_run

    if isinstance(config, RunConfig) and not overrides and not sets:
        return check_run(config)  # resolved already: checked as it is, not rebuilt from a dict
    return _resolve(lambda data, sets: check_run(config_from_dict(data, sets)), config, overrides, sets)


def new_run_dir(cfg: RunConfig):
    """A fresh run directory for `cfg`, with its `config.yaml` written."""
    from schedrl.training.run_dir import RunDir

    name = cfg.name or f"{cfg.task.name}-{datetime.now():%Y%m%d-%H%M%S}"
    run = RunDir.create(cfg.out_dir, name)
    write_config(run, cfg)
    return run


def write_config(run, cfg: Any) -> None:
    """The run directory's `config.yaml` (a `RunConfig` or a `ClassicConfig`), replaced atomically."""
    tmp = run.config_path.with_suffix(".yaml.tmp")
    tmp.write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    os.replace(tmp, run.config_path)


def saved_config(
    run_dir: str | os.PathLike[str], overrides: Mapping[str, Any] | None = None, sets: Sequence[str] = ()
) -> RunConfig:
    """A run directory's own config, with overrides on top (its replaced keys translated)."""
    from schedrl.training.run_dir import RunDir

    run = RunDir.open(run_dir)
    data = migrate_saved(read_recipe(run.config_path))
    try:
        return resolve_config(data, overrides, sets)
    except ConfigError as err:
        raise ConfigError(f"{run.config_path}: {err}") from None


def check_before_start(cfg: RunConfig, source: Any = None) -> Any:
    """What fails only when the run is built (an unknown task; a bad dataset row; a missing extra), checked
    before the run directory exists; returns the task source (`source`, or the one the config names, built
    here once). Policies, losses and their arguments were checked when the config was resolved."""
    from schedrl.envs import make_task
    from schedrl.training.loggers import EXTRAS

    if (
        cfg.pipeline.mode == "async"
        and cfg.pipeline.backend == "ray"
        and importlib.util.find_spec("ray") is None
    ):
        raise ImportError(
            "pipeline.backend 'ray' needs Ray: pip install 'schedrl[ray]' (or use backend 'threads')"
        )
    for name in cfg.logging.backends:
        if name in EXTRAS and importlib.util.find_spec(EXTRAS[name][0]) is None:
            raise ImportError(
                f"logging backend {name!r} needs the {EXTRAS[name][1]}: pip install 'schedrl[{name}]'"
            )
    if cfg.learner.lora is not None:
        check_lora_targets(cfg)
    return source if source is not None else make_task(cfg.task.name, **cfg.task.args)


def check_lora_targets(cfg: RunConfig) -> None:
    """`learner.lora.target_modules` against the model's linear layers (the model built on the meta
    device: no weights are read)."""
    import torch

    from schedrl.models import build_char_tokenizer, build_tiny_model, preset
    from schedrl.training.lora import check_targets, lora_spec

    with torch.device("meta"):
        if cfg.model.path is None:
            model = build_tiny_model(build_char_tokenizer(), preset(cfg.model.preset, cfg.model.tiny_seed))
        else:
            from transformers import AutoConfig, AutoModelForCausalLM

            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cfg.model.path))
    try:
        check_targets(model, lora_spec(cfg.learner.lora or {})["target_modules"])
    except ValueError as err:
        raise ConfigError(f"config field 'learner.lora': {err}") from None


def train(
    config: Any = None,
    *,
    resume: str | os.PathLike[str] | None = None,
    on_step: StepCallback | None = None,
    on_sft_step: StepCallback | None = None,
    sets: Sequence[str] = (),
    source: Any = None,
    verbose: bool = False,
    **overrides: Any,
) -> Result:
    """Train with a recipe (a YAML path, a dict, a `RunConfig`, or None for the defaults) and keyword
    overrides, or continue the run directory `resume` from its last checkpoint (its saved config, with
    any overrides). `on_step(step, metrics)` sees every logged step; `sets` are ``a.b=c`` overrides;
    `source` replaces the task the config names (what `Trainer` passes). Quiet as the command line is:
    `verbose=True` lets transformers print its progress bars and warnings."""
    from schedrl.models.loading import hf_output

    with hf_output(verbose):
        return _train(config, resume, on_step, on_sft_step, sets, source, overrides)


def _train(config, resume, on_step, on_sft_step, sets, source, overrides: dict[str, Any]) -> Result:
    from schedrl.classic import is_classic
    from schedrl.orchestrate.run import train as run_training
    from schedrl.training.run_dir import RunDir

    start = time.perf_counter()
    if resume is not None and is_classic(read_recipe(RunDir.open(resume).config_path)):
        if config is not None:
            raise ValueError(
                "train(resume=...) continues the run's saved config; give overrides, not a config"
            )
        return train_classic_run(None, overrides, sets, on_step, resume=resume)
    if resume is None and is_classic(_as_dict(config)):
        return train_classic_run(config, overrides, sets, on_step)
    if resume is not None:
        if config is not None:
            raise ValueError(
                "train(resume=...) continues the run's saved config; give overrides, not a config"
            )
        cfg = saved_config(resume, overrides, sets)
        run = RunDir.open(resume)
        write_config(run, cfg)
    else:
        cfg = resolve_config(config, overrides, sets)
        source = check_before_start(cfg, source)
        run = new_run_dir(cfg)
    out = run_training(
        cfg, run, resume=resume is not None, on_step=on_step, on_sft_step=on_sft_step, source=source
    )
    return Result(
        out["eval_before"],
        out["eval_after"],
        Path(out["run_dir"]),
        Path(out["plot"]),
        cfg,
        time.perf_counter() - start,
    )


def resolve_classic(config: Any = None, overrides: Mapping[str, Any] | None = None, sets: Sequence[str] = ()):
    """The validated `ClassicConfig` of a classic recipe (path, dict or ClassicConfig) with overrides."""
    from schedrl.classic import classic_config_from_dict

    return _resolve(classic_config_from_dict, config, overrides, sets)


def train_classic_run(
    config: Any,
    overrides: Mapping[str, Any],
    sets: Sequence[str],
    on_step: StepCallback | None,
    resume: str | os.PathLike[str] | None = None,
) -> Result:
    """A classic PPO run (`schedrl.classic`): new from `config`, or continued from `resume`."""
    from schedrl.classic import train_classic
    from schedrl.classic.envs import make_envs
    from schedrl.training.run_dir import RunDir

    start = time.perf_counter()
    if resume is not None:
        run = RunDir.open(resume)
        try:
            cfg = resolve_classic(read_recipe(run.config_path), overrides, sets)
        except ConfigError as err:
            raise ConfigError(f"{run.config_path}: {err}") from None
    else:
        cfg = resolve_classic(config, overrides, sets)
        make_envs(cfg.env, 1).close()  # an unknown environment fails before the run directory exists
        name = cfg.name or f"{cfg.env.id.replace('/', '-')}-{datetime.now():%Y%m%d-%H%M%S}"
        cfg = dataclasses.replace(cfg, name=name)
        run = RunDir.create(cfg.out_dir, name)
    write_config(run, cfg)
    out = train_classic(cfg, run, resume=resume is not None, on_update=on_step)
    return Result(
        out["eval_before"], out["eval_after"], run.root, run.plot_path, cfg, time.perf_counter() - start
    )


def _dotted(fn: Callable) -> str | None:
    """`module:qualname` of a function importable by that name, else None (a lambda, a closure, __main__)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        return None
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if obj is fn else None


def _write_rows(dataset: Any, path: Path) -> Path:
    rows = dataset.to_list() if hasattr(dataset, "to_list") else list(dataset)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for i, row in enumerate(rows):
            try:
                f.write(json.dumps(row) + "\n")
            except TypeError as err:
                raise ValueError(
                    f"dataset row {i}: a column is not JSON (text, numbers, lists, dicts): {err}"
                ) from None
    return path


class Trainer:
    """A run built from objects, as TRL's `GRPOTrainer`: a model (a `PreTrainedModel` or a path), its
    tokenizer (`processing_class` is TRL's name for it), reward functions (TRL's batch shape or
    schedrl's per-sample one, with `reward_weights`), datasets (`datasets.Dataset` or a list of dicts,
    `prompt` a string or a list of chat messages), and a config (path, dict or RunConfig; `args` is
    TRL's name for it) with keyword overrides. Without an SFT section no warm-up runs, as in TRL."""

    def __init__(
        self,
        model: Any = None,
        tokenizer: Any = None,
        *,
        reward_funcs: Callable | Sequence[Callable] | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        config: Any = None,
        reward_weights: Sequence[float] | None = None,
        processing_class: Any = None,
        args: Any = None,
        **overrides: Any,
    ) -> None:
        if reward_funcs is None:
            raise ValueError("Trainer needs reward_funcs: one function or a list of them")
        if train_dataset is None:
            raise ValueError("Trainer needs a train_dataset (a datasets.Dataset or a list of dicts)")
        if config is not None and args is not None:
            raise ValueError("Trainer takes config or args (TRL's name), not both")
        if tokenizer is not None and processing_class is not None:
            raise ValueError("Trainer takes tokenizer or processing_class (TRL's name), not both")
        self.model, self.tokenizer = model, tokenizer if tokenizer is not None else processing_class
        self.reward_funcs = list(reward_funcs) if isinstance(reward_funcs, Sequence) else [reward_funcs]
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        base = _as_dict(config if config is not None else args)
        if "reward_weights" in base:  # where TRL's GRPOConfig keeps them
            if reward_weights is not None:
                raise ValueError("reward_weights given twice: as an argument and in the config")
            reward_weights = base.pop("reward_weights")
        self.reward_weights = None if reward_weights is None else [float(w) for w in reward_weights]
        base.setdefault("sft", {}).setdefault("steps", 0)
        self.config = merge_overrides(base, overrides)
        self.result: Result | None = None

    def _tokenizer(self) -> Any:
        if self.tokenizer is not None:
            return self.tokenizer
        if isinstance(self.model, str | os.PathLike):
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(self.model)
        raise ValueError("Trainer needs a tokenizer (or processing_class) for a model object")

    def _source(self) -> Any:
        from schedrl.envs.chat import require_chat_template
        from schedrl.envs.user import FileTask

        source = FileTask(
            rows=self.train_dataset,
            eval_rows=self.eval_dataset,
            reward=self.reward_funcs,
            reward_weights=self.reward_weights,
        )
        if any(t.messages is not None for t in source.tasks):
            require_chat_template(self._tokenizer())
        return source

    def _task_config(self, data_dir: Path) -> dict[str, Any]:
        """The task as a config records it: the datasets written beside the run, the rewards by path."""
        args: dict[str, Any] = {"path": str(_write_rows(self.train_dataset, data_dir / "train.jsonl"))}
        if self.eval_dataset is not None:
            args["eval_path"] = str(_write_rows(self.eval_dataset, data_dir / "eval.jsonl"))
        args["reward"] = [
            _dotted(fn) or f"<in-memory {getattr(fn, '__name__', fn)!s}>" for fn in self.reward_funcs
        ]
        if self.reward_weights is not None:
            args["reward_weights"] = self.reward_weights
        return {"name": "file", "args": args}

    def train(
        self, resume: str | os.PathLike[str] | None = None, on_step: StepCallback | None = None
    ) -> Result:
        """Run it (or continue the run directory `resume`, with this trainer's objects)."""
        if resume is not None:
            run_dir = Path(resume)
            source = self._source()
            self.result = train(resume=run_dir, on_step=on_step, source=source)
            return self.result
        source = self._source()  # bad data fails here, before anything is written
        cfg = resolve_config(self.config)
        name = cfg.name or f"trainer-{datetime.now():%Y%m%d-%H%M%S}"
        run_dir = Path(cfg.out_dir) / name
        if (run_dir / "metrics.jsonl").exists():
            raise FileExistsError(
                f"{run_dir} already holds a run: continue it with train(resume={str(run_dir)!r}) "
                "(GRPOTrainer: train(resume_from_checkpoint=True)), or name another directory"
            )
        data = merge_overrides(self.config, {"name": name})
        data["task"] = {
            **data.get("task", {}),
            **self._task_config(run_dir / "data"),
        }  # name and args replaced
        if self.model is not None:
            from schedrl.models.loading import hf_output

            with hf_output(verbose=False):
                data.setdefault("model", {})["path"] = str(self._save_start(run_dir / "start_model"))
        self.result = train(data, on_step=on_step, source=source)
        return self.result

    def _save_start(self, path: Path) -> Path:
        """The starting weights and tokenizer, saved in the run directory so that it resumes on its own."""
        if isinstance(self.model, str | os.PathLike) and self.tokenizer is None:
            return Path(self.model)
        model = self.model
        if isinstance(model, str | os.PathLike):
            from schedrl.models import load_model_and_tokenizer

            model = load_model_and_tokenizer(Path(model), device="cpu")[0]
        model.save_pretrained(path)
        self._tokenizer().save_pretrained(path)
        return path


__all__ = ["Result", "Trainer", "train"]
