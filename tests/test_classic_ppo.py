"""Classic PPO: GAE across episode ends, both Gymnasium autoreset modes, the policy's log-probabilities
against torch.distributions, the non-finite guard, exact resume, and CartPole solved from the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

import schedrl
from schedrl.algos.ppo import gae
from schedrl.classic import PPO, ActorCritic, classic_config_from_dict
from schedrl.classic.config import PPOSection
from schedrl.classic.ppo import NonFiniteError, advantages
from schedrl.classic.rollout import Collector, ObsNormalizer
from schedrl.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = ROOT / "examples" / "cartpole_ppo.yaml"
TIMING = {"step_s", "rollout_s", "train_s", "env_steps_per_s", "elapsed_s", "solved_at_s"}


def test_gae_stops_at_episode_ends_and_bootstraps_the_last_value():
    rewards = torch.tensor([[1.0, 1.0, 1.0]])
    values = torch.tensor([[0.5, 0.5, 0.5]])
    ends = torch.tensor([[False, True, False]])
    adv, ret = gae(rewards, values, torch.ones(1, 3), 0.9, 0.8, ends=ends, last_value=torch.tensor([2.0]))
    # t=2: 1 + 0.9*2 - 0.5 = 2.3; t=1 ends: 1 - 0.5 = 0.5; t=0: (1 + 0.9*0.5 - 0.5) + 0.9*0.8*0.5 = 1.31
    assert adv[0].tolist() == pytest.approx([1.31, 0.5, 2.3])
    assert ret[0].tolist() == pytest.approx([1.81, 1.0, 2.8])
    # an invalid step (a NEXT_STEP reset) in between is skipped: it neither reads nor passes on anything
    rewards, values = torch.tensor([[1.0, 99.0, 1.0]]), torch.tensor([[0.5, 99.0, 0.5]])
    mask, ends = torch.tensor([[1, 0, 1]]), torch.tensor([[True, False, False]])
    adv, _ = gae(rewards, values, mask, 0.9, 0.8, ends=ends, last_value=torch.tensor([2.0]))
    assert adv[0].tolist() == pytest.approx([0.5, 0.0, 2.3])


class Count(gym.Env):
    """obs = [steps taken]; reward 1 a step. A copy reset with an even seed terminates after 3 steps; one
    with an odd seed never does, so its time limit (4) cuts it."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.terminates = seed % 2 == 0
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.terminates and self.t == 3, False, {}


gym.register("schedrl-test/Count-v0", entry_point=Count, max_episode_steps=4)


def _value_is_the_observation() -> ActorCritic:
    policy = ActorCritic(1, n_actions=2, hidden=())
    with torch.no_grad():  # V(obs) = obs: a bootstrap from the wrong observation shows in the reward
        policy.v[0].weight.fill_(1.0)
        policy.v[0].bias.zero_()
    return policy


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_both_autoreset_modes_give_the_same_transitions(mode):
    envs = gym.make_vec("schedrl-test/Count-v0", num_envs=2, vector_kwargs={"autoreset_mode": mode})
    collector = Collector(envs, _value_is_the_observation(), ObsNormalizer((1,), 10.0, False), gamma=0.5)
    collector.reset(seed=0)  # copy 0: seed 0, terminates after 3; copy 1: seed 1, cut at 4
    r = collector.collect(12)
    rows = []
    for i in range(2):
        valid = r.valid[:, i]
        rows.append(list(zip(r.rewards[valid, i].tolist(), r.ends[valid, i].tolist(), strict=True))[:8])
    terminated = [(1.0, False), (1.0, False), (1.0, True)]
    assert rows[0] == (terminated * 3)[:8]
    cut = [(1.0, False)] * 3 + [(1.0 + 0.5 * 4.0, True)]  # 1 + gamma V(final obs [4]), not V(reset obs [0])
    assert rows[1] == cut * 2
    if mode == AutoresetMode.NEXT_STEP:  # the step after each end is the copy's reset: no experience
        assert r.valid[:, 0].tolist() == [True, True, True, False] * 3
        assert r.valid[:, 1].tolist() == [True, True, True, True, False] * 2 + [True, True]
    else:
        assert bool(r.valid.all())
    assert collector.take_episodes()[:2] == [(3.0, 3), (4.0, 4)]
    envs.close()


def test_masked_actions_are_never_sampled_and_logprobs_match_torch_distributions():
    torch.manual_seed(0)
    policy = ActorCritic(3, n_actions=4)
    obs = torch.randn(500, 3)
    mask = torch.ones(500, 4, dtype=torch.bool)
    mask[:, 1] = False
    mask[::2, 3] = False
    action, logp, _ = policy.act(obs, mask)
    assert not mask.gather(1, action[:, None]).logical_not().any()  # never a masked action
    dist = torch.distributions.Categorical(logits=policy.pi(obs).masked_fill(~mask, float("-inf")))
    assert torch.allclose(logp, dist.log_prob(action), atol=1e-6)
    new_logp, entropy, _ = policy.evaluate(obs, action, mask)
    assert torch.allclose(new_logp, dist.log_prob(action), atol=1e-6)
    assert torch.allclose(entropy, dist.entropy(), atol=1e-5)
    with pytest.raises(ValueError, match="allows no action"):
        policy.act(obs[:1], torch.zeros(1, 4, dtype=torch.bool))

    gauss = ActorCritic(3, action_dim=2, log_std_init=-0.5)
    a, logp, _ = gauss.act(obs)
    normal = torch.distributions.Normal(gauss.pi(obs), torch.full((2,), -0.5).exp())
    assert torch.allclose(logp, normal.log_prob(a).sum(-1), atol=1e-5)
    _, entropy, _ = gauss.evaluate(obs, a)
    assert torch.allclose(entropy, normal.entropy().sum(-1), atol=1e-5)


def _rollout_and_ppo():
    envs = gym.make_vec("CartPole-v1", num_envs=4)
    torch.manual_seed(0)
    policy = ActorCritic.for_spaces(envs.single_observation_space, envs.single_action_space)
    collector = Collector(envs, policy, ObsNormalizer((4,), 10.0, False), gamma=0.99)
    collector.reset(seed=0)
    rollout = collector.collect(32)
    envs.close()
    return rollout, PPO(policy, PPOSection(n_steps=32, batch_size=64, n_epochs=2, max_bad_steps=3))


def test_a_non_finite_minibatch_is_skipped_without_touching_the_optimizer():
    rollout, ppo = _rollout_and_ppo()
    ppo.update(rollout, 1.0)  # the moments exist now
    before = {k: v.clone() for k, v in ppo.optimizer.state_dict()["state"][0].items()}
    weights = {k: v.clone() for k, v in ppo.policy.state_dict().items()}
    rollout.rewards[:, 0] = float(
        "nan"
    )  # one copy's rewards: every minibatch holds some, and normalizes them
    with pytest.raises(NonFiniteError, match=r"3 minibatches in a row .*ppo.max_bad_steps=3"):
        ppo.update(rollout, 1.0)
    after = ppo.optimizer.state_dict()["state"][0]
    assert all(torch.equal(before[k], after[k]) for k in before)  # bit-identical moments and step
    assert all(torch.equal(weights[k], v) for k, v in ppo.policy.state_dict().items())
    assert ppo.skipped == 3


def test_advantages_are_zero_on_invalid_steps():
    rollout, _ = _rollout_and_ppo()
    rollout.valid[5, 1] = False
    adv, ret = advantages(rollout, 0.99, 0.95)
    assert adv[5, 1] == 0 and ret[5, 1] == 0 and bool(torch.isfinite(adv).all())


def _rows(result) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in result.metrics]


def test_a_resumed_run_repeats_the_uninterrupted_one_exactly(tmp_path):
    run = {
        "total_steps": 6 * 256,
        "save_every": 2,
        "eval": {"episodes": 4},
        "logging": {"backends": ["jsonl"]},
    }
    whole = schedrl.train(CARTPOLE, out_dir=str(tmp_path), name="whole", **run)

    def crash(update, metrics):
        if update == 3:
            raise KeyboardInterrupt  # the run dies after update 3; its last checkpoint is update 2

    with pytest.raises(KeyboardInterrupt):
        schedrl.train(CARTPOLE, out_dir=str(tmp_path), name="cut", on_step=crash, **run)
    resumed = schedrl.train(resume=tmp_path / "cut")
    assert [r["step"] for r in resumed.metrics if "env_steps" in r] == list(range(1, 7))
    assert _rows(resumed) == _rows(whole)
    assert resumed.eval_after == whole.eval_after


def test_continuous_actions_run_on_pendulum(tmp_path):
    result = schedrl.train(
        {"env": {"id": "Pendulum-v1", "num_envs": 2, "normalize_obs": True}, "ppo": {"n_steps": 64}},
        total_steps=512,
        out_dir=str(tmp_path),
        name="pendulum",
        eval={"episodes": 2},
    )
    assert math.isfinite(result.eval_after["return_mean"]) and result.eval_after["length_mean"] == 200
    assert max(r.get("env_steps", 0) for r in result.metrics) >= 512


def test_bad_classic_recipes_name_the_field_and_leave_no_run_directory(tmp_path):
    with pytest.raises(ValueError, match=r"'env.id': 'CartPol-v1' is not a registered .*CartPole-v1"):
        schedrl.train({"env": {"id": "CartPol-v1"}}, out_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"unknown config key 'ppo.n_step'"):
        schedrl.train({"env": {}, "ppo": {"n_step": 3}}, out_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"'ppo.batch_size' \(512\) is larger than a rollout"):
        classic_config_from_dict({"env": {"num_envs": 2}, "ppo": {"n_steps": 8, "batch_size": 512}})
    with pytest.raises(ConfigError, match=r"'ppo.gamma' must be in \[0, 1\], got 1.5"):
        classic_config_from_dict({"env": {}, "ppo": {"gamma": 1.5}})
    assert not any(tmp_path.iterdir())


@pytest.mark.subprocess
@pytest.mark.train
def test_cartpole_is_solved_from_the_command_line(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "schedrl.cli",
        "train",
        str(CARTPOLE),
        "--set",
        f"out_dir={tmp_path}",
        "--set",
        "name=cp",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300)
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["eval_before"]["return_mean"] < 100 <= 475 <= summary["eval_after"]["return_mean"]
    assert summary["solved_at_steps"] is not None and summary["solved_at_steps"] <= 100_000
    run = tmp_path / "cp"
    for name in ("config.yaml", "metrics.jsonl", "timeline.jsonl", "reward.png", "checkpoints/latest"):
        assert (run / name).exists(), name
    assert any((run / "tb").iterdir())
    subprocess.run(
        [sys.executable, "-m", "schedrl.cli", "report", str(run)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    page = (run / "report.html").read_text()
    assert "id='rewards' data-points='0'" not in page and "id='eval' data-points='0'" not in page


def test_the_attention_policys_written_out_layers_are_its_encoder_module():
    """`EntityAttentionPolicy._attend` (what runs) against the `nn.TransformerEncoder` it takes its weights
    from, with padding rows, in training and in evaluation: equal outputs on the real rows and equal
    gradients."""
    from schedrl.classic.attention import EntityAttentionPolicy

    torch.manual_seed(0)
    policy = EntityAttentionPolicy(features=5, dim=16, layers=2, heads=4)
    x = torch.randn(3, 6, 16)
    real = torch.ones(3, 6, dtype=torch.bool)
    real[0, 4:] = False
    real[2, 1:] = False
    for real_now in (real, torch.ones_like(real)):
        for train in (True, False):
            policy.train(train)
            xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
            ours = policy._attend(xa, real_now)
            module = policy.encoder(xb, src_key_padding_mask=~real_now)
            assert torch.allclose(ours[real_now], module[real_now], atol=1e-5)
            (ours[real_now] ** 2).sum().backward()
            (module[real_now] ** 2).sum().backward()
            assert xa.grad is not None and xb.grad is not None
            assert torch.allclose(xa.grad, xb.grad, atol=1e-4)
    policy.eval()
    with torch.no_grad():  # the module's nested-tensor fast path
        assert torch.allclose(
            policy._attend(x, real)[real], policy.encoder(x, src_key_padding_mask=~real)[real], atol=1e-5
        )
        obs = torch.randn(3, 6, 5)
        obs[..., 0] = real.float()
        h, pooled, _ = policy._encode(obs)
        reference = policy.pi(torch.cat([h, pooled[:, None].expand_as(h)], -1)).squeeze(-1)
        logits, _ = policy._heads(obs, None)
        assert torch.allclose(logits[real], reference[real], atol=1e-5)  # pi's split first layer


def test_the_attention_policy_samples_at_a_temperature():
    from schedrl.classic.attention import EntityAttentionPolicy

    torch.manual_seed(1)
    policy = EntityAttentionPolicy(features=5, dim=16, layers=1, heads=2).eval()
    obs = torch.randn(64, 7, 5)
    obs[..., 0] = 1.0
    logits, _ = policy._heads(obs, None)
    greedy = logits.argmax(-1)
    cold, cold_logp, _ = policy.act(obs, temperature=1e-6)
    assert torch.equal(cold, greedy) and torch.allclose(cold_logp, torch.zeros(64), atol=1e-4)
    warm, warm_logp, _ = policy.act(obs, temperature=2.0)
    assert not torch.equal(warm, greedy)
    expected = torch.log_softmax(logits / 2.0, -1).gather(-1, warm[:, None]).squeeze(-1)
    assert torch.allclose(warm_logp, expected, atol=1e-6)
