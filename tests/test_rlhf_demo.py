"""The RLHF example's pieces: its rejected answers are always wrong and of each kind; its pairs read back;
`schedrl demo --task rlhf --fast` runs end to end and prints its JSON; held-out evaluation judges by the
task's rule, not by the reward model; the report draws the over-optimisation curve."""

from __future__ import annotations

import json
import random

import pytest

from schedrl.envs import make_task
from schedrl.rewards.preferences import read_pairs
from schedrl.rewards.rlhf_demo import SORT, mistake, write_pairs


def test_mistakes_are_wrong_and_of_every_kind():
    source = make_task(SORT["name"], **SORT["args"])
    rng = random.Random(0)
    tasks = source.sample("train", 300, 0)
    kinds = set()
    in_order_but_wrong = 0  # hard negatives: sorted, with the wrong digits
    for t in tasks:
        wrong = mistake(t, rng)
        assert wrong != t.answer
        in_order_but_wrong += (
            wrong.isdigit() and wrong == "".join(sorted(wrong)) and sorted(wrong) != sorted(t.answer)
        )
        if not wrong.isdigit():
            kinds.add("not digits")
        elif sorted(wrong) == sorted(t.answer):
            kinds.add("order")
        elif not set(wrong) <= set(t.prompt):
            kinds.add("changed or unrelated")
        elif len(wrong) < len(t.answer):
            kinds.add("dropped")
        elif len(wrong) > len(t.answer):
            kinds.add("repeated")
        else:
            kinds.add("changed or unrelated")
    assert kinds == {"order", "dropped", "repeated", "changed or unrelated", "not digits"}
    assert in_order_but_wrong > len(tasks) // 4


def test_the_pairs_read_back(tmp_path):
    write_pairs(tmp_path / "p.jsonl", 50, seed=1)
    pairs = read_pairs(tmp_path / "p.jsonl")
    assert len(pairs) == 50 and all(
        p.chosen == "".join(sorted(p.chosen)) and p.chosen != p.rejected for p in pairs
    )


@pytest.mark.train
def test_the_rlhf_demo_runs_fast_and_reports(tmp_path, capsys):
    from schedrl.cli import main
    from schedrl.run_report import write_run_report

    assert main(["demo", "--task", "rlhf", "--fast", "--out-dir", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"true_reward_before", "true_reward_after", "rule_grpo_true_reward", "rm_heldout_accuracy"} <= set(
        out
    )
    run = next(tmp_path.glob("rlhf-*"))
    rows = [json.loads(x) for x in (run / "rlhf" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "loss" in r]
    assert trained and all("kl" in r and "rewards/rule/mean" in r for r in trained)
    # the run trains on the reward model's score alone: its reward is the model's mean, not the rule's
    model_key = next(k for k in trained[0] if k.startswith("rewards/reward_model_"))
    assert all(abs(r["reward_mean"] - r[model_key]) < 1e-5 for r in trained)
    evals = [r for r in rows if "eval/pass@1" in r]
    # judged by the rule (0 or 1 a sample): the mean reward is the pass rate, not a reward model's score
    assert evals and all(r["eval/mean_reward"] == r["eval/pass@1"] for r in evals)
    page = write_run_report(run / "rlhf").read_text()
    assert "id='overoptimisation' data-points='0'" not in page and "id='overoptimisation'" in page
