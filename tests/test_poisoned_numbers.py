"""Poisoned numbers: NaN or Inf in the log-probs, the advantages (from rewards) and one gradient. The step
is skipped and counted, the optimizer's state is bit-identical afterwards, and the run stops after
`optim.max_bad_steps` such steps in a row; a reward that is not finite scores 0 and is counted."""

from __future__ import annotations

import copy

import pytest
import torch

from schedrl.config import AlgoConfig, OptimConfig
from schedrl.envs.base import Task
from schedrl.envs.scoring import RewardScorer
from schedrl.envs.user import FileTask
from schedrl.training.batch import collate
from schedrl.training.learner import Learner, NonFiniteLossError
from schedrl.types import Sample, SamplingParams


def _batch(n: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(4, 90, (3,), generator=g).tolist() for _ in range(n)]
    completions = [torch.randint(4, 90, (4,), generator=g).tolist() for _ in range(n)]
    logprobs = [[-1.0] * 4 for _ in range(n)]
    return collate(prompts, completions, pad_id=0, behaviour_logp=logprobs), torch.randn(n, generator=g)


def _optimizer_state(learner: Learner) -> list[torch.Tensor]:
    state = learner.optimizer.state_dict()["state"]
    return [t.clone() for s in state.values() for t in s.values() if torch.is_tensor(t)]


def _poison(kind: str, learner: Learner, batch, adv):
    """The batch and advantages of one poisoned update; for a gradient, a hook that spoils one once."""
    batch, adv = copy.deepcopy(batch), adv.clone()
    if kind == "logprobs":
        batch.behaviour_logp[0, -1] = float("nan")
    elif kind == "advantages":
        adv[1] = float("inf")
    else:
        param = next(p for p in learner.model.parameters() if p.requires_grad)
        handle = None

        def spoil(grad):
            assert handle is not None
            handle.remove()
            out = grad.clone()
            out.view(-1)[0] = float("nan")
            return out

        handle = param.register_hook(spoil)
    return batch, adv


@pytest.mark.parametrize("kind", ["logprobs", "advantages", "gradient"])
def test_a_poisoned_step_is_skipped_and_leaves_the_optimizer_bit_identical(default_model, kind):
    model = copy.deepcopy(default_model)
    # decoupled PPO reads the behaviour log-probs, so a NaN there reaches the loss
    learner = Learner(model, OptimConfig(max_bad_steps=3), AlgoConfig(correction="decoupled"), total_steps=10)
    batch, adv = _batch()
    learner.update(batch, adv, 0)  # a good step: the moment buffers exist
    moments, params = (
        _optimizer_state(learner),
        torch.nn.utils.parameters_to_vector(model.parameters()).clone(),
    )
    assert moments, "no optimizer state to compare"
    stats = learner.update(*_poison(kind, learner, batch, adv), 1)
    assert stats["skipped_steps"] == 1 and learner.bad_in_a_row == 1
    after = _optimizer_state(learner)
    assert len(after) == len(moments) and all(torch.equal(a, b) for a, b in zip(after, moments, strict=True))
    assert torch.equal(torch.nn.utils.parameters_to_vector(model.parameters()), params)
    learner.update(batch, adv, 2)  # a good step trains again and resets the run of bad ones
    assert learner.bad_in_a_row == 0
    assert not torch.equal(torch.nn.utils.parameters_to_vector(model.parameters()), params)


def test_the_run_stops_after_max_bad_steps_in_a_row(default_model):
    learner = Learner(
        copy.deepcopy(default_model), OptimConfig(max_bad_steps=2), AlgoConfig(), total_steps=10
    )
    batch, adv = _batch()
    bad = adv.clone()
    bad[0] = float("nan")
    learner.update(batch, bad, 0)
    with pytest.raises(NonFiniteLossError, match=r"2 optimizer steps in a row .*optim.max_bad_steps=2"):
        learner.update(batch, bad, 1)


def test_a_reward_that_is_not_finite_scores_zero_and_is_counted():
    def poisoned(task, completion):
        return {"nan": float("nan"), "inf": float("inf")}.get(completion, 1.0)

    rows = [{"prompt": f"q{i}", "id": f"t{i}"} for i in range(3)]
    source = FileTask(rows=rows, reward=poisoned, eval_fraction=0.0)
    tasks: dict[str, Task] = {t.id: t for t in source.tasks}
    samples = [
        Sample(f"r{i}", (1,), (2,), (0.0,), (0,), "stop", SamplingParams(2), text=text, task_id=f"t{i}")
        for i, text in enumerate(["nan", "ok", "inf"])
    ]
    scorer = RewardScorer(source, max_error_rate=1.0)
    assert scorer(tasks, samples) == [0.0, 1.0, 0.0]
    assert scorer.errors == 2 and "returned inf for task 't2'" in str(scorer.last_error)
