import pytest
import yaml

from schedrl.api import resolve_config
from schedrl.config import ConfigError, RunConfig, config_from_dict, config_to_dict, load_config


def test_defaults_and_overrides():
    cfg = config_from_dict({"sampling": {"group_size": 4}}, ["optim.lr=1e-3", "task.args={max_digits: 2}"])
    assert cfg.sampling.group_size == 4 and cfg.optim.lr == 1e-3 and cfg.task.args == {"max_digits": 2}
    assert cfg.steps == RunConfig().steps
    assert config_from_dict(config_to_dict(cfg)) == cfg


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"sampling": {"group_sise": 4}},
            "unknown config key 'sampling.group_sise'; valid keys here: prompts_per_step",
        ),
        ({"bogus": 1}, "unknown config key 'bogus'"),
        ({"sampling": {"group_size": "4"}}, "config field 'sampling.group_size' must be int, got '4'"),
        (
            {"sampling": {"prompts_per_step": 0}},
            "config field 'sampling.prompts_per_step' must be > 0, got 0",
        ),
        ({"optim": {"micro_batch_size": -2}}, "config field 'optim.micro_batch_size' must be > 0, got -2"),
        (
            {"optim": {"schedule": "polynomial"}},
            "config field 'optim.schedule' must be one of 'constant', 'warmup'",
        ),
        ({"optim": {"betas": [0.9]}}, "config field 'optim.betas' must be tuple"),
        ({"steps": True}, "config field 'steps' must be int, got True"),
        ({"optim": {"lr": "fast"}}, "config field 'optim.lr' must be float, got 'fast'"),
        ({"sampling": {"top_p": 1.5}}, "config field 'sampling.top_p' must be in (0, 1], got 1.5"),
        (
            {"task": {"max_env_error_rate": 1.5}},
            "config field 'task.max_env_error_rate' must be in [0, 1], got 1.5",
        ),
        ({"sampling": 3}, "config field 'sampling' must be a mapping, got 3"),
    ],
)
def test_bad_config_names_the_field_and_value(data, message):
    with pytest.raises(ConfigError) as err:
        config_from_dict(data)
    assert message in str(err.value)


def test_yaml_file_errors_name_the_file(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("steps: 10\nsampling:\n  group_size: 0\n")
    with pytest.raises(
        ConfigError, match=r"recipe.yaml: config field 'sampling.group_size' must be > 0, got 0"
    ):
        load_config(path)
    path.write_text("steps: [1, 2\n")
    with pytest.raises(ConfigError, match="recipe.yaml' is not valid YAML"):
        load_config(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    path.write_text("steps: 7\noptim:\n  lr: 1e-4\n")
    cfg = load_config(path, ["sampling.max_new_tokens=12"])
    assert (cfg.steps, cfg.optim.lr, cfg.sampling.max_new_tokens) == (7, 1e-4, 12)


@pytest.mark.parametrize("text", ["nokey", "=3", "a..b=1"])
def test_bad_override(text):
    with pytest.raises(ConfigError, match="override"):
        config_from_dict({}, [text])


def test_examples_are_valid_recipes():
    from pathlib import Path

    from schedrl.classic import classic_config_from_dict, is_classic
    from schedrl.config import read_recipe

    recipes = sorted(Path(__file__).parent.parent.joinpath("examples").glob("*.yaml"))
    assert recipes
    for path in recipes:
        data = read_recipe(path)
        if is_classic(data):  # a classic PPO recipe: its own config, and the LM loader says so
            classic_config_from_dict(data)
            with pytest.raises(ConfigError, match=r"classic PPO recipe .*schedrl train"):
                load_config(path)
        else:
            load_config(path)


@pytest.mark.parametrize(
    ("section", "key", "replacement"),
    [
        ("pipeline", "inflight_weight_updates", "schedule.weight_sync: inflight"),
        ("pipeline", "partial_rollouts", "schedule.consumption: partial"),
        ("engine", "share_prompts", "engine.prefill_prompt_once"),
        ("optim", "share_prompts", "optim.forward_prompt_once"),
    ],
)
def test_replaced_keys_name_what_replaces_them(section, key, replacement):
    with pytest.raises(ConfigError, match=f"config key '{section}.{key}' was replaced: use {replacement}"):
        config_from_dict({section: {key: True}})


def test_pipeline_policies_are_checked_by_name():
    cfg = config_from_dict({"schedule": {"weight_sync": "cut_resume", "consumption": "partial"}})
    assert (cfg.schedule.weight_sync, cfg.schedule.consumption) == ("cut_resume", "partial")
    with pytest.raises(ConfigError, match="'schedule.weight_sync'.*'eager'.*cut_resume, drain, inflight"):
        resolve_config({"schedule": {"weight_sync": "eager"}})
    with pytest.raises(ConfigError, match="weight_sync 'inflight'.*choose 'decoupled'"):
        resolve_config({"pipeline": {"mode": "async"}, "schedule": {"weight_sync": "inflight"}})


def test_multi_turn_environments_run_in_both_loops_without_speculation_or_pruning():
    tools = {"name": "calc", "env": "tools", "env_args": {"tools": ["schedrl.envs.calc:calc"]}}
    assert config_from_dict({"task": tools}).task.env == "tools"
    assert config_from_dict({"task": tools, "pipeline": {"mode": "async"}}).pipeline.mode == "async"
    with pytest.raises(
        ConfigError, match="'schedule.rollout': rollout mode 'speculative' does not run under multi-turn"
    ):
        resolve_config({"task": tools, "schedule": {"rollout": "speculative"}})
    with pytest.raises(ConfigError, match="'task.max_turns' must be > 0"):
        config_from_dict({"task": {**tools, "max_turns": 0}})
    with pytest.raises(
        ConfigError,
        match="'task.env' must be one of calendar, experiments, guess, gym, lookup, openenv, recall, repair, single_turn, tools, verifiers or a dotted path",
    ):
        resolve_config({"task": {"env": "chat"}})


def test_a_saved_run_config_with_replaced_keys_still_loads(tmp_path):
    """Run directories from before the keys were replaced hold them (every field is saved): resume works."""
    old = config_to_dict(RunConfig())
    old["pipeline"] |= {"inflight_weight_updates": False, "partial_rollouts": True}
    del old["schedule"]
    old["engine"]["share_prompts"] = old["engine"].pop("prefill_prompt_once")
    old["optim"]["share_prompts"] = False
    del old["optim"]["forward_prompt_once"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(old))
    with pytest.raises(ConfigError, match="was replaced"):
        load_config(path)
    cfg = load_config(path, saved=True)
    assert (cfg.schedule.weight_sync, cfg.schedule.consumption) == ("cut_resume", "partial")
    assert cfg.engine.prefill_prompt_once and not cfg.optim.forward_prompt_once


def test_the_embedded_jssp_demo_recipe_is_the_shipped_one():
    from pathlib import Path

    from schedrl.classic import classic_config_from_dict
    from schedrl.cli_train import JSSP_DEMO
    from schedrl.config import read_recipe

    shipped = read_recipe(Path(__file__).parent.parent / "examples" / "jssp_ppo.yaml")
    assert classic_config_from_dict(shipped) == classic_config_from_dict(JSSP_DEMO)
