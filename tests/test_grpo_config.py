"""schedrl.GRPOConfig: TRL's field names and defaults, mapped onto a run config; nothing silently ignored."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from schedrl import GRPOConfig, GRPOTrainer
from schedrl.api import resolve_config
from schedrl.config import ConfigError
from schedrl.training.checkpoint import write_checkpoint
from schedrl.training.run_dir import MetricsLogger, RunDir
from schedrl.training.schedules import linear_decay, make_schedule


def test_every_field_is_trls_with_trls_default():
    trl = pytest.importorskip("trl")
    theirs = {f.name: f for f in dataclasses.fields(trl.GRPOConfig)}
    for f in dataclasses.fields(GRPOConfig):
        if f.name == "extra":
            continue
        assert f.name in theirs, f"{f.name} is not a field of TRL's GRPOConfig"
        default = theirs[f.name].default
        if default is dataclasses.MISSING:
            default = theirs[f.name].default_factory()  # type: ignore[misc]
        if f.name in ("output_dir", "report_to", "bf16"):  # None resolved later, in both
            continue
        assert f.default == default, f"{f.name}: schedrl {f.default!r}, TRL {default!r}"


def test_trl_batch_fields_become_prompts_micro_batches_and_steps():
    args = GRPOConfig(
        output_dir="out/run1",
        per_device_train_batch_size=32,
        gradient_accumulation_steps=4,
        num_generations=8,
        max_steps=300,
        max_completion_length=16,
        learning_rate=3e-4,
        seed=7,
    )
    cfg = resolve_config(args.to_config())
    # 32 x 4 = 128 completions per optimizer step = 16 prompts x 8, one optimizer step per round
    assert (cfg.sampling.prompts_per_step, cfg.sampling.group_size) == (16, 8)
    assert (cfg.optim.micro_batch_size, cfg.optim.minibatches, cfg.steps) == (32, 1, 300)
    assert (cfg.out_dir, cfg.name, cfg.seed) == ("out", "run1", 7)
    assert (cfg.sampling.max_new_tokens, cfg.optim.lr, cfg.optim.schedule) == (16, 3e-4, "linear")
    assert cfg.optim.gradient_checkpointing and cfg.logging.every == 10 and cfg.save_every == 500
    assert cfg.keep_last is None and cfg.sft.steps == 0
    # two optimizer steps per generation round, two passes (num_iterations): 4 optimizer steps a round
    two = GRPOConfig(
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        steps_per_generation=4,
        num_generations=4,
        num_iterations=2,
        max_steps=40,
    )
    cfg = resolve_config(two.to_config())
    assert (cfg.sampling.prompts_per_step, cfg.optim.minibatches, cfg.optim.ppo_epochs, cfg.steps) == (
        8,
        2,
        2,
        10,
    )
    assert (cfg.logging.every, cfg.save_every) == (2, 125)  # 10 and 500 optimizer steps, at 4 a round
    # epochs: 3 passes over 100 prompts at 16 prompts a round
    assert GRPOConfig(per_device_train_batch_size=16, num_generations=1).to_config(100)["steps"] == math.ceil(
        3 * 100 / 16
    )


@pytest.mark.parametrize(
    ("fields", "algo"),
    [
        ({}, {"loss": "grpo", "loss_agg": "token_mean", "advantage": "grpo", "std_normalize": True}),  # dapo
        ({"loss_type": "grpo"}, {"loss": "grpo", "loss_agg": "seq_mean"}),
        ({"loss_type": "dr_grpo", "scale_rewards": "none"}, {"loss": "drgrpo", "std_normalize": False}),
        ({"importance_sampling_level": "sequence"}, {"loss": "gspo", "loss_agg": "token_mean"}),
        ({"scale_rewards": "batch"}, {"advantage": "lite_ppo", "std_normalize": True}),
        ({"scale_rewards": False}, {"advantage": "grpo", "std_normalize": False}),
        (
            {"beta": 0.04, "use_bias_correction_kl": False, "epsilon": 0.1, "epsilon_high": 0.28},
            {"kl_coef": 0.04, "kl_estimator": "k3", "loss_args": {"clip_eps": 0.1, "clip_eps_high": 0.28}},
        ),
    ],
)
def test_loss_fields_map_to_the_loss_trl_computes(fields, algo):
    cfg = GRPOConfig(max_steps=10, **fields).to_config()
    for key, value in algo.items():
        assert cfg["algo"][key] == value, key
    resolve_config(cfg)  # a valid run config


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"loss_type": "sapo"}, "'loss_type' = 'sapo'"),
        ({"loss_type": "cispo"}, "'loss_type' = 'cispo'"),
        ({"use_vllm": True}, "'use_vllm' = True"),
        ({"delta": 2.0}, "'delta' = 2.0"),
        ({"beta": 0.04}, "'use_bias_correction_kl' = True"),
        ({"lr_scheduler_type": "polynomial"}, "'lr_scheduler_type' = 'polynomial'"),
        ({"report_to": ["tensorboard", "comet_ml"]}, "'report_to' = 'comet_ml'"),
        ({"num_generations": 3}, "'num_generations' = 3"),
        ({"max_steps": 7, "num_iterations": 2}, "'max_steps' = 7"),
        ({"save_strategy": "epoch"}, "'save_strategy' = 'epoch'"),
        ({"run_name": "other"}, "'run_name' = 'other'"),
        ({"adam_epsilon": 1e-6}, "'adam_epsilon' = 1e-06"),
        ({"loss_type": "bnpo", "gradient_accumulation_steps": 2}, "'loss_type' = 'bnpo'"),
    ],
)
def test_an_unsupported_value_names_the_field_and_value(fields, message):
    with pytest.raises(ConfigError) as err:
        GRPOConfig(**{"output_dir": "out/r", "max_steps": 8, **fields}).to_config()
    assert message in str(err.value)


def test_an_unknown_field_is_an_error_naming_it():
    with pytest.raises(TypeError, match="vllm_mode"):
        GRPOConfig(vllm_mode="server")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="peft_config"):
        GRPOTrainer(
            model="m", reward_funcs=[len], args=GRPOConfig(), train_dataset=[{}], peft_config=object()
        )


def test_extra_sets_schedrl_fields_on_top():
    extra = {"sft": {"steps": 30}, "schedule": {"max_staleness": 2}, "algo": {"correction": "tis"}}
    cfg = GRPOConfig(max_steps=4, extra=extra).to_config()
    assert cfg["sft"]["steps"] == 30 and cfg["algo"]["loss_agg"] == "token_mean"  # merged, not replaced
    assert resolve_config(cfg).schedule.max_staleness == 2


def test_linear_schedule_matches_transformers_and_its_closed_form():
    from transformers import get_linear_schedule_with_warmup

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    theirs = get_linear_schedule_with_warmup(opt, num_warmup_steps=0, num_training_steps=10)
    ours = make_schedule("linear", 1.0, 0, 10)
    for t in range(12):
        assert math.isclose(ours(t), opt.param_groups[0]["lr"], abs_tol=1e-12), t
        opt.step()
        theirs.step()
    warm = linear_decay(2.0, total_steps=10, warmup_steps=2)  # (t + 1) / 2 warm-up, then (10 - t) / 8
    assert [warm(t) for t in (0, 1, 2, 6, 10)] == [1.0, 2.0, 2.0, 1.0, 0.0]


def test_logging_every_mirrors_every_nth_step_and_every_eval(tmp_path):
    logged: list[int] = []

    class Sink:
        def log(self, step, scalars):
            logged.append(step)

        def flush(self):
            pass

        def close(self):
            pass

    logger = MetricsLogger(RunDir.create(tmp_path, "r"), backends=("jsonl",), every=3)
    logger._sinks = [Sink()]
    for step in range(8):
        logger.log(step, {"x": 1.0})
    logger.log(5, {"pass@1": 0.5}, prefix="eval/")
    logger.close()
    assert logged == [0, 3, 6, 5]
    assert len(logger.run.metrics_path.read_text().splitlines()) == 9  # metrics.jsonl has every row


def test_keep_last_none_keeps_every_checkpoint(tmp_path):
    for step in range(5):
        write_checkpoint(tmp_path, step, lambda d: (d / "state.json").write_text("{}"), keep_last=None)
    assert len(list(tmp_path.glob("step_*"))) == 5
    write_checkpoint(tmp_path, 5, lambda d: (d / "state.json").write_text("{}"), keep_last=2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000004", "step_000005"]
