"""Cloning a heuristic before PPO, and the learned admission policy inside the real engine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from schedrl.classic.config import ClassicConfig, EnvSection, PretrainSection, classic_config_from_dict
from schedrl.classic.imitate import clone
from schedrl.config import ConfigError
from schedrl.entity_attention import EntityAttentionPolicy, load_entity_policy, save_entity_policy
from schedrl.envs.scheduling.admission_env import (
    FEATURES,
    AdmissionEnv,
    LongtailJobs,
    StepCost,
    admission_features,
    teacher_choice,
)
from schedrl.rollout.learned import Learned, LearnedAdmission
from schedrl.rollout.predictors import LengthPredictor, SiblingPredictor
from schedrl.rollout.registry import ADMISSION, make_admission
from schedrl.types import Request, SamplingParams


def test_admission_features_closed_form():
    obs = admission_features([4.0, 10.0, 6.0], [3, 5, 2], [2.0, 20.0], slots=4, num_waiting=5, max_waiting=4)
    assert obs.shape == (4, FEATURES) and not obs[3].any()  # one padding row
    scale = 20.0  # the longest length in sight: a running remainder
    np.testing.assert_allclose(obs[:3, 0], 1)
    np.testing.assert_allclose(obs[:3, 1], [4 / scale, 10 / scale, 6 / scale])
    np.testing.assert_allclose(obs[:3, 2], [3 / scale, 5 / scale, 2 / scale])
    np.testing.assert_allclose(obs[:3, 3], [0, 1 / 3, 2 / 3])
    np.testing.assert_allclose(obs[:3, 4], 2 / 4)
    np.testing.assert_allclose(obs[:3, 5], 20 / scale)
    np.testing.assert_allclose(obs[:3, 6], 22 / (4 * scale))
    np.testing.assert_allclose(obs[:3, 7], [0, 1, 0])
    np.testing.assert_allclose(obs[:3, 8], 5 / 9)
    empty = admission_features([], [], [], slots=4, num_waiting=0, max_waiting=2)
    assert not empty.any()
    assert teacher_choice("lpt", [3, 9, 9]) == 1 and teacher_choice("spt", [3, 1, 1]) == 1
    assert teacher_choice("fcfs", [3, 9]) == 0
    with pytest.raises(ValueError, match="unknown admission teacher 'longest'"):
        teacher_choice("longest", [1.0])


def lpt_network() -> EntityAttentionPolicy:
    """An attention policy built by hand whose logit is 100 x feature 1 (predicted length): LPT."""
    torch.manual_seed(0)
    p = EntityAttentionPolicy(FEATURES, dim=8, layers=1, heads=1)
    with torch.no_grad():
        for param in p.parameters():
            param.zero_()
        p.embed[0].weight[0, 1] = 1.0  # unit 0 reads the predicted length ...
        p.embed[2].weight[0, 0] = 1.0  # ... and passes it on; the encoder's residual branches are zero
        p.pi[0].weight[0, 0] = 1.0
        p.pi[2].weight[0, 0] = 100.0
    return p


class Given(LengthPredictor):
    def __init__(self, lengths: dict[str, float]) -> None:
        super().__init__()
        self.lengths = lengths

    def predict(self, request: Request) -> float:
        return self.lengths[request.id]


def test_the_learned_policy_admits_as_its_network_scores(tmp_path):
    path = tmp_path / "lpt.pt"
    save_entity_policy(path, lpt_network(), {"by": "hand"})
    policy, info = load_entity_policy(path)
    assert info["by"] == "hand" and info["architecture"]["dim"] == 8
    lengths = {"a": 3.0, "b": 30.0, "c": 7.0, "d": 30.0, "e": 12.0}
    waiting = [Request(r, (1, 2), SamplingParams(max_new_tokens=40)) for r in lengths]
    chosen = LearnedAdmission(path, Given(lengths), slots=4).select(
        waiting, free_slots=3, token_budget=100, num_running=0
    )
    assert chosen == [1, 3, 4]  # longest predicted first; equal ones in arrival order
    # the prefill budget stops admission in order, as take_in_order does
    assert LearnedAdmission(path, Given(lengths), slots=4).select(
        waiting, free_slots=3, token_budget=5, num_running=0
    ) == [1, 3]


def test_the_learned_policy_matches_its_environment_in_the_engine(tmp_path, model, tokenizer):
    """In the engine, a policy admits the order it chooses in the simulated engine on the same requests."""
    from schedrl.engine import EngineConfig, HFEngine

    path = tmp_path / "lpt.pt"
    save_entity_policy(path, lpt_network(), {})
    jobs = LongtailJobs(12, sigma=0.3)(np.random.default_rng(5))
    reqs = [
        Request(
            f"r{k}", (5,) * j.prompt, SamplingParams(max_new_tokens=j.length, temperature=0, ignore_eos=True)
        )
        for k, j in enumerate(jobs)
    ]
    pred = {r.id: j.predicted for r, j in zip(reqs, jobs, strict=True)}
    engine = HFEngine(
        model, tokenizer, EngineConfig(max_concurrency=3), admission=LearnedAdmission(path, Given(pred))
    )
    out = engine.generate(reqs)
    order = [s.request_id for s in sorted(out, key=lambda s: (s.timings.admitted, -pred[s.request_id]))]
    env = AdmissionEnv(lambda rng: list(jobs), 3, StepCost(), max_waiting=64, normalize=False)
    obs, info = env.reset(seed=0)
    expected, done = [], False
    while not done:
        a = int(policy_choice(lpt_network(), obs, info["action_mask"]))
        expected.append(env.offered[a])
        obs, _, done, _, info = env.step(a)
    assert order == [f"r{j}" for j in expected]
    assert [s.num_tokens for s in sorted(out, key=lambda s: int(s.request_id[1:]))] == [
        j.length for j in jobs
    ]


def policy_choice(policy, obs, mask) -> int:
    return int(policy.act(torch.from_numpy(obs)[None], torch.from_numpy(mask)[None], deterministic=True)[0])


def test_engine_admission_learned_is_built_from_a_checkpoint_and_refuses_bad_ones(tmp_path):
    path = tmp_path / "lpt.pt"
    save_entity_policy(path, lpt_network(), {})
    assert isinstance(make_admission("learned", checkpoint=str(path)), LearnedAdmission)
    with pytest.raises(ValueError, match="admission policy 'learned': argument 'checkpoint' is required"):
        make_admission("learned")
    with pytest.raises(ValueError, match="unknown argument.*slot"):
        make_admission("learned", checkpoint=str(path), slot=3)
    with pytest.raises(
        ValueError,
        match=r"admission policy 'learned': argument 'checkpoint' must be an existing policy file or classic "
        r"run directory, got '.*missing.pt'",
    ):
        make_admission("learned", checkpoint=str(tmp_path / "missing.pt"))
    with pytest.raises(ValueError, match="no such policy file or run directory"):
        LearnedAdmission(tmp_path / "missing.pt")
    other = tmp_path / "dag.pt"
    save_entity_policy(other, EntityAttentionPolicy(12, 8, 1, 1), {})
    with pytest.raises(ValueError, match="reads 12 features per request"):
        make_admission("learned", checkpoint=str(other))
    (tmp_path / "junk.pt").write_bytes(b"not a policy")
    with pytest.raises(Exception, match="junk.pt|pickle|invalid load key"):
        make_admission("learned", checkpoint=str(tmp_path / "junk.pt"))


def test_checking_learned_loads_nothing_and_checks_the_predictor(tmp_path, monkeypatch):
    """A config check builds the `Args` only: no checkpoint is read (this one is not even a policy), but a
    bad argument of the predictor it names is caught; building reads the checkpoint."""
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a policy")

    def no_load(*args, **kwargs):
        raise AssertionError("a check loaded a checkpoint")

    monkeypatch.setattr(torch, "load", no_load)
    args = ADMISSION.check("learned", {"checkpoint": str(junk), "predictor": "history", "max_waiting": 8})
    assert args == Learned.Args(checkpoint=str(junk), predictor="history", max_waiting=8)
    with pytest.raises(
        ValueError, match=r"'learned': argument 'predictor_args'.*'default' must be >= 0, got -1"
    ):
        ADMISSION.check("learned", {"checkpoint": str(junk), "predictor_args": {"default": -1}})
    with pytest.raises(ValueError, match=r"'learned': argument 'max_waiting' must be > 0, got 0"):
        ADMISSION.check("learned", {"checkpoint": str(junk), "max_waiting": 0})
    monkeypatch.undo()
    path = tmp_path / "lpt.pt"
    save_entity_policy(path, lpt_network(), {})
    policy = ADMISSION.build("learned", {"checkpoint": str(path), "max_waiting": 8})
    assert isinstance(policy, Learned) and isinstance(policy.predictor, SiblingPredictor)
    assert policy.max_waiting == 8 and policy.info["architecture"]["dim"] == 8


def test_cloning_the_lpt_teacher_reproduces_lpt_schedules():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    env_section = EnvSection(
        id="schedrl/Admission-v0",
        kwargs={"requests": 16, "slots": 4, "max_waiting": 16, "cost": {"base": 1.0}},
    )
    policy = EntityAttentionPolicy(FEATURES, dim=16, layers=1, heads=2)
    stats = clone(
        policy, env_section, PretrainSection(teacher="lpt", decisions=1500, epochs=6, lr=3e-3), seed=0
    )
    assert stats["pretrain/decisions"] == 1500 and stats["pretrain/agreement"] > 0.97, stats
    # on held-out workloads the clone's greedy schedules are LPT's schedules
    env = AdmissionEnv(LongtailJobs(16), 4, StepCost(1.0), max_waiting=16, normalize=False)
    same = 0
    for seed in range(5):
        obs, info = env.reset(seed=123 + seed)
        agree, done = True, False
        while not done:
            a = policy_choice(policy, obs, info["action_mask"])
            agree &= a == env.teacher_action("lpt")
            obs, _, done, _, info = env.step(a)
        same += agree
    assert same >= 4


def test_pretrain_errors_name_the_field():
    with pytest.raises(ConfigError, match="env.normalize_obs"):
        classic_config_from_dict({"env": {"normalize_obs": True}, "pretrain": {"teacher": "lpt"}})
    with pytest.raises(ConfigError, match="pretrain.decisions"):
        classic_config_from_dict({"env": {}, "pretrain": {"decisions": 0}})
    cart = ClassicConfig().env
    with pytest.raises(ValueError, match="pretrain.teacher.*CartPole-v1.*no teacher_action"):
        clone(EntityAttentionPolicy(4), cart, PretrainSection(teacher="lpt", decisions=10), 0)
    adm = EnvSection(id="schedrl/Admission-v0", kwargs={"requests": 8, "slots": 2, "max_waiting": 8})
    with pytest.raises(ValueError, match="pretrain.teacher.*unknown admission teacher 'heft'"):
        clone(EntityAttentionPolicy(FEATURES, 8, 1, 1), adm, PretrainSection(teacher="heft", decisions=10), 0)


def test_the_committed_policy_schedules_held_out_workloads_as_well_as_lpt():
    """bench/policies/admission_attention.pt (examples/admission_ppo.yaml): its simulated makespans on
    held-out workloads are no longer than longest-predicted-first's, and shorter than FCFS's."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from admission_rl import HELD_OUT_SEED, POLICY, simulate_policy

    policy, trained = load_entity_policy(POLICY)
    assert trained["env_steps"] >= 32_768 and trained["architecture"]["features"] == FEATURES
    cost = StepCost(0.0013, per_prefill=1.93e-5)
    learned, lpt, fcfs = [], [], []
    for w in range(6):
        jobs = LongtailJobs(64, 0.5)(np.random.default_rng(HELD_OUT_SEED + w))
        learned.append(simulate_policy(jobs, 8, cost, policy))
        lpt.append(simulate_policy(jobs, 8, cost, "lpt"))
        fcfs.append(simulate_policy(jobs, 8, cost, "fcfs"))
    assert np.mean(learned) <= np.mean(lpt) * (1 + 1e-9), (learned, lpt)
    assert np.mean(fcfs) / np.mean(learned) > 1.1


@pytest.mark.train
def test_a_run_with_pretrain_clones_once_then_trains_and_resumes_exactly(tmp_path):
    import schedrl

    recipe = {
        "env": {
            "id": "schedrl/Admission-v0",
            "num_envs": 2,
            "kwargs": {"requests": 12, "slots": 3, "max_waiting": 12, "cost": {"base": 1.0}},
        },
        "ppo": {"n_steps": 24, "batch_size": 24, "n_epochs": 1, "gamma": 1.0},
        "policy": {"kind": "attention", "dim": 16, "layers": 1, "heads": 2},
        "pretrain": {"teacher": "lpt", "decisions": 300, "epochs": 3, "lr": 3e-3},
        "eval": {"episodes": 3},
        "logging": {"backends": ["jsonl"]},
        "total_steps": 4 * 48,
        "save_every": 2,
    }
    whole = schedrl.train(recipe, out_dir=str(tmp_path), name="whole")
    rows = [r for r in whole.metrics if "pretrain/agreement" in r]
    assert len(rows) == 1 and rows[0]["step"] == 0 and rows[0]["pretrain/decisions"] == 300
    assert any("eval_cloned/return_mean" in r for r in whole.metrics)

    def crash(update, metrics):
        if update == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        schedrl.train(recipe, out_dir=str(tmp_path), name="cut", on_step=crash)
    resumed = schedrl.train(resume=tmp_path / "cut")
    assert len([r for r in resumed.metrics if "pretrain/agreement" in r]) == 1  # not cloned again
    train_rows = lambda res: [  # noqa: E731
        {k: v for k, v in r.items() if not k.endswith("_s") and "per_s" not in k}
        for r in res.metrics
        if "env_steps" in r
    ]
    assert train_rows(resumed) == train_rows(whole)
