"""`forecast`: the Brier reward and the outcomes it is scored on, and the loop that holds a question's
samples unscored until the batch that resolves it is drawn (both loops), with its bad input."""

from __future__ import annotations

import pytest

import schedrl
from schedrl.config import ConfigError
from schedrl.envs import make_task
from schedrl.envs.forecast import ForecastTask, brier_reward, outcome, parse_forecast
from schedrl.orchestrate.buffer import Group


def test_brier_reward_closed_form():
    assert brier_reward(0.3, 1) == pytest.approx(0.51)
    assert brier_reward(0.3, 0) == pytest.approx(0.91)
    assert brier_reward(1.0, 1) == 1.0 and brier_reward(1.0, 0) == 0.0


def test_parse_forecast_takes_tenths_only():
    assert parse_forecast(" 0.3 ") == 0.3 and parse_forecast("1.0") == 1.0 and parse_forecast("0.0") == 0.0
    for bad in ("0.35", ".3", "3", "1.1", "0.3 0.4", "p=0.3", ""):
        assert parse_forecast(bad) is None, bad


def test_outcomes_follow_the_record_and_the_rate_is_the_best_forecast():
    """Each event is drawn once from its record's rate; the Brier reward's mean over events is highest at
    that rate (a proper scoring rule), and the reward is that Brier score."""
    source = ForecastTask()
    tasks = [t for t in source.sample("train", 4000, seed=1) if t.answer == "0.3"]
    assert len(tasks) > 150
    wins = [outcome(t) for t in tasks]
    assert abs(sum(wins) / len(wins) - 0.3) < 0.08
    assert [outcome(t) for t in tasks] == wins  # once per event: the same every time it is asked
    mean = {q: sum(source.reward(t, q) for t in tasks) / len(tasks) for q in ("0.1", "0.3", "0.5", "0.7")}
    assert max(mean, key=mean.__getitem__) == "0.3", mean
    t = tasks[0]
    assert source.reward(t, "0.3") == pytest.approx(brier_reward(0.3, outcome(t)))
    assert source.reward(t, "maybe") == 0.0


def test_each_question_is_its_own_event_and_eval_judges_calibration():
    source = ForecastTask(max_delay=3)
    tasks = source.sample("train", 200, seed=0)
    assert len({t.id for t in tasks}) == 200  # the same record asked twice is two events
    assert {t.metadata["resolves_in"] for t in tasks} == {1, 2, 3}
    rule = source.rule_source
    t = next(t for t in rule.sample("eval", 50, seed=0) if t.answer == "0.4")
    assert t.prompt.endswith("p=") and rule.reward(t, "0.4") == 1.0 and rule.reward(t, "0.5") == 0.0
    assert not {t.prompt for t in tasks} & {t.prompt for t in source.sample("eval", 100, seed=0)}


def test_bad_delays_are_named():
    with pytest.raises(ValueError, match="min_delay"):
        make_task("forecast", max_delay=1, min_delay=2)


def test_a_held_group_round_trips_through_a_checkpoint():
    source = ForecastTask()
    from schedrl.types import Sample, SamplingParams

    task = source.sample("train", 1, seed=0)[0]
    s = Sample("g/0", (1,), (2, 3), (-0.1, -0.2), (4, 4), "stop", SamplingParams(4), "0.3", group_id="g")
    g = Group("g", task, [], wave=3, need=4, resolves=5, waiting={0: s})
    back = Group.from_dict(g.to_dict())
    assert back.resolves == 5 and back.waiting == {0: s} and not back.complete
    assert back.to_send() == []  # a held sample is finished: nothing of it goes to an engine again


class Spy(ForecastTask):
    """Forecasting that records, for every training reward it computes, whether the batch resolving its
    question had been drawn (the data scheduler draws one `sample("train")` per batch)."""

    def __init__(self) -> None:
        super().__init__(max_delay=2)
        self.draws, self.drawn, self.early, self.scored = 0, {}, [], 0

    def sample(self, split, n, seed):
        tasks = super().sample(split, n, seed)
        if split == "train" and n != 1:
            self.drawn.update((t.id, self.draws) for t in tasks)
            self.draws += 1
        return tasks

    def reward(self, task, completion):
        if task.id in self.drawn:
            self.scored += 1
            if self.draws <= self.drawn[task.id] + task.metadata["resolves_in"]:
                self.early.append(task.id)
        return super().reward(task, completion)


RECIPE = {
    "steps": 4,
    "task": {"name": "forecast"},
    "schedule": {"max_staleness": 2},
    "algo": {"std_normalize": False, "correction": "decoupled"},
    "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
    "eval": {"tasks": 0},
}


@pytest.mark.train
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_samples_are_scored_only_once_their_question_resolves(tmp_path, mode):
    spy, rows = Spy(), []
    sets = [f"pipeline.mode={mode}", *(["pipeline.backend=threads"] if mode == "async" else [])]
    schedrl.train(RECIPE, out_dir=str(tmp_path), source=spy, sets=sets, on_step=lambda s, m: rows.append(m))
    assert spy.scored >= 4 * 16 and spy.early == []
    held = [m["rewards_held"] for m in rows if "rewards_held" in m]
    assert len(held) == 4 and max(held) > 0
    assert all(m["staleness_max"] <= 2 for m in rows if "staleness_max" in m)


def test_a_schedule_that_cannot_wait_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"'schedule.max_staleness' is 1.*up to 2 batches"):
        schedrl.train({**RECIPE, "schedule": {"max_staleness": 1}}, out_dir=str(tmp_path))
    sets = ["pipeline.mode=async", "pipeline.reward_placement=colocated"]
    with pytest.raises(ConfigError, match="'pipeline.reward_placement' must be 'driver' or 'separate'"):
        schedrl.train(RECIPE, out_dir=str(tmp_path), sets=sets)
