"""`algo.loss` with `algo.loss_args`: each loss checks its own arguments (its `Args`), the learner passes
them by keyword, old recipes get the migration error and old run directories still resume."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import pytest
import torch
import yaml

from schedrl.algos import masked_mean, registry
from schedrl.algos.loss_call import loss_call
from schedrl.algos.losses import ClipArgs
from schedrl.algos.ppo import PPOArgs
from schedrl.algos.registry import LOSSES
from schedrl.algos.spec import Loss, LossSpec
from schedrl.config import _OLD_LOSS_ARGS, AlgoConfig, ConfigError, OptimConfig, config_from_dict, load_config
from schedrl.registry import check_arg
from schedrl.training.batch import collate
from schedrl.training.learner import Learner


@dataclass(frozen=True)
class ScaleArgs:
    scale: float = 1.0  # multiplies the advantages

    def __post_init__(self) -> None:
        check_arg(self.scale > 0, "scale", self.scale, "> 0")


def scaled_reinforce(logp, old_logp, adv, mask, *, agg, scale):
    return masked_mean(-scale * adv[:, None] * logp, mask, agg), {"scale": scale}


SCALED = Loss(scaled_reinforce, LossSpec(args=ScaleArgs))  # named as algo.loss: tests.test_loss_args:SCALED


@pytest.mark.parametrize("name", LOSSES.names())
def test_every_loss_declares_frozen_args_with_defaults(name):
    args = LOSSES.get(name).Args
    if args is None:
        assert LOSSES.check(name, {}) is None
        return
    assert dataclasses.is_dataclass(args) and args.__dataclass_params__.frozen
    missing = [f.name for f in dataclasses.fields(args) if f.default is dataclasses.MISSING]
    assert missing == [], f"{name}: {missing} have no default"
    assert isinstance(LOSSES.check(name, {}), args)


def test_args_defaults_are_the_old_config_defaults():
    """A saved config moves only the values that differ from the old `AlgoConfig` defaults: every loss's
    Args must default to those, or an old run would resume with other settings."""
    for name in LOSSES.names():
        args = LOSSES.get(name).Args
        for f in dataclasses.fields(args) if args else ():
            if f.name in _OLD_LOSS_ARGS:
                assert f.default == _OLD_LOSS_ARGS[f.name], (name, f.name)


def test_the_ppo_clip_family_shares_its_arguments():
    family = ("ppo_clip", "grpo", "dapo", "drgrpo", "gspo", "decoupled_ppo", "cross_stage_is")
    assert {LOSSES.get(n).Args for n in family} == {ClipArgs}
    assert all(issubclass(LOSSES.get(n).Args, ClipArgs) for n in ("ppo", "sao", "cispo"))


def test_bad_arguments_name_the_loss_the_argument_and_the_value():
    with pytest.raises(
        ValueError, match=r"loss 'grpo': unknown argument 'vf_coef'; valid: clip_eps, clip_eps_high"
    ):
        loss_call(AlgoConfig(loss_args={"vf_coef": 0.5}))
    with pytest.raises(ValueError, match=r"loss 'grpo': argument 'clip_eps' must be in \[0, 1\), got 1.0"):
        loss_call(AlgoConfig(loss_args={"clip_eps": 1.0}))
    assert loss_call(AlgoConfig(loss="cispo", loss_args={"clip_eps": 1.0})).kwargs["clip_eps"] == 1.0
    with pytest.raises(ValueError, match=r"loss 'ppo': argument 'gae_lambda' must be in \[0, 1\], got 1.5"):
        LOSSES.check("ppo", {"gae_lambda": 1.5})
    with pytest.raises(ValueError, match=r"loss 'rover': argument 'rover_temp' must be > 0, got 0"):
        LOSSES.check("rover", {"rover_temp": 0})
    with pytest.raises(ValueError, match=r"loss 'tis' takes no arguments, got clip_eps"):
        LOSSES.check("tis", {"clip_eps": 0.1})


def test_the_call_gets_the_args_and_the_run_wide_settings():
    call = loss_call(AlgoConfig(loss="ppo", loss_args={"gae_lambda": 0.9, "vf_coef": 0.5}, kl_coef=0.1))
    assert call.args == PPOArgs(vf_coef=0.5, gae_lambda=0.9)
    assert call.advantage_kwargs == {"gae_gamma": 1.0, "gae_lambda": 0.9}
    assert call.kwargs == {
        "clip_eps": 0.2,
        "clip_eps_high": None,
        "vf_coef": 0.5,
        "vf_clip": 0.2,
        "kl_coef": 0.1,
        "kl_estimator": "k3",
        "agg": "token_mean",
    }
    # a correction replaces grpo's surrogate with grpo's clip range, and takes algo.is_cap
    fixed = loss_call(AlgoConfig(loss_args={"clip_eps_high": 0.28}, correction="decoupled", is_cap=3.0))
    assert fixed.name == "decoupled_ppo" and fixed.args == ClipArgs(0.2, 0.28)
    assert fixed.kwargs == {
        "clip_eps": 0.2,
        "clip_eps_high": 0.28,
        "kl_coef": 0.0,
        "kl_estimator": "k3",
        "is_cap": 3.0,
        "agg": "token_mean",
    }
    assert loss_call(AlgoConfig(correction="tis")).kwargs == {
        "kl_coef": 0.0,
        "kl_estimator": "k3",
        "is_cap": 2.0,
        "agg": "token_mean",
    }


def test_a_loss_named_by_its_dotted_path_trains(default_model):
    name = "tests.test_loss_args:SCALED"
    checked = LOSSES.check(name, {"scale": 0.5})  # the module imported by its path: its own ScaleArgs
    assert type(checked).__name__ == "ScaleArgs" and checked.scale == 0.5
    with pytest.raises(ValueError, match=r"loss 'tests.test_loss_args:SCALED': argument 'scale' must be > 0"):
        LOSSES.check(name, {"scale": -1})
    with pytest.raises(ValueError, match="must name a schedrl.algos.spec.Loss"):
        registry.resolve("tests.test_loss_args:scaled_reinforce")
    batch = collate([[5, 6], [7, 8, 9]], [[10, 11], [12]], 0)
    algo = AlgoConfig(loss=name, loss_args={"scale": 0.5})
    learner = Learner(copy.deepcopy(default_model), OptimConfig(), algo, 10)
    assert learner.update(batch, torch.tensor([1.0, -1.0]), 0)["scale"] == 0.5


def test_an_old_recipe_gets_the_new_keys():
    with pytest.raises(ConfigError, match=r"config key 'algo.name' was replaced: use algo.loss$"):
        config_from_dict({"algo": {"name": "ppo"}})
    with pytest.raises(
        ConfigError, match=r"'algo.clip_eps_high' was replaced: use algo.loss_args: \{clip_eps_high: "
    ):
        config_from_dict({"algo": {"clip_eps_high": 0.28}})
    with pytest.raises(
        ConfigError, match=r"'algo.pacs_beta' was replaced: use algo.loss_args: \{pacs_beta: "
    ):
        config_from_dict({"algo": {"pacs_beta": 2.0}})


# `algo:` as a run saved it before algo.loss: every field, the per-loss ones included.
OLD_ALGO = {
    "name": "ppo",
    "advantage": "reward",
    "std_normalize": True,
    "turn_credit": "broadcast",
    "turn_discount": 1.0,
    "clip_eps": 0.2,
    "clip_eps_high": 0.28,
    "loss_agg": "token_mean",
    "kl_coef": 0.0,
    "kl_estimator": "k3",
    "entropy_coef": 0.0,
    "correction": "none",
    "is_cap": 2.0,
    "gae_gamma": 1.0,
    "gae_lambda": 0.9,
    "vf_coef": 0.5,
    "vf_clip": 0.2,
    "rover_temp": 1.0,
    "pacs_beta": 1.0,
}


def _old_run_config(tmp_path, **algo):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"steps": 5, "algo": {**OLD_ALGO, **algo}}))
    return path


def test_an_old_saved_config_resumes_with_the_same_loss_arguments(tmp_path, default_model):
    path = _old_run_config(tmp_path)
    with pytest.raises(ConfigError, match="was replaced"):
        load_config(path)
    algo = load_config(path, saved=True).algo
    assert (algo.loss, algo.advantage) == ("ppo", "reward")
    assert algo.loss_args == {"clip_eps_high": 0.28, "gae_lambda": 0.9, "vf_coef": 0.5}
    call = loss_call(algo)
    # what the learner passed before, read from the old fields
    assert call.kwargs == {
        "clip_eps": 0.2,
        "clip_eps_high": 0.28,
        "vf_coef": 0.5,
        "vf_clip": 0.2,
        "kl_coef": 0.0,
        "kl_estimator": "k3",
        "agg": "token_mean",
    }
    assert call.advantage_kwargs == {"gae_gamma": 1.0, "gae_lambda": 0.9}
    new = AlgoConfig(
        loss="ppo", advantage="reward", loss_args={"clip_eps_high": 0.28, "gae_lambda": 0.9, "vf_coef": 0.5}
    )
    batch = collate([[5, 6], [7, 8, 9]], [[10, 11], [12]], 0)
    stats = [
        Learner(copy.deepcopy(default_model), OptimConfig(), a, 10).update(batch, torch.tensor([1.0, 0.0]), 0)
        for a in (algo, new)
    ]
    assert stats[0] == stats[1]


def test_an_old_rapid_run_keeps_its_cap(tmp_path):
    """rapid read algo.is_cap before it had arguments of its own."""
    defaults = {"clip_eps_high": None, "gae_lambda": 0.95, "vf_coef": 0.1}
    path = _old_run_config(tmp_path, name="rapid", advantage="grpo", is_cap=3.0, **defaults)
    algo = load_config(path, saved=True).algo
    assert (algo.loss, algo.loss_args) == ("rapid", {"is_cap": 3.0})
    assert loss_call(algo).kwargs == {"is_cap": 3.0, "agg": "token_mean"}


def test_an_old_run_with_a_setting_its_loss_ignored_names_it(tmp_path):
    """The migration cannot ask a loss what it takes: a non-default value it ignored then is refused now,
    by name, when the run is checked."""
    algo = load_config(_old_run_config(tmp_path, name="rover", advantage="grpo"), saved=True).algo
    with pytest.raises(
        ValueError, match=r"loss 'rover': unknown argument 'clip_eps_high'; valid: rover_temp"
    ):
        loss_call(algo)
