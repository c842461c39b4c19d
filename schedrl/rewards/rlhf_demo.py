"""The end-to-end RLHF example (`schedrl demo --task rlhf`): preferences from a hidden rule, a reward model
trained on them, GRPO against the reward model, judged by the rule itself.

The hidden rule is the `sort` task's: the answer is the prompt's digits in order. Preference pairs are
drawn from training prompts: the chosen side is the sorted answer, the rejected side a plausible mistake
(the digits in another order, one digit changed, dropped or repeated, unrelated digits, or characters
that are not digits). A reward model learns the pairs (`schedrl rm`), then the policy is trained by GRPO with the reward model's score as its only
reward (`task.reward_model` with `rule_weight: 0`) and a small KL penalty to its start, whose value is
logged each step: the over-optimisation curve (the reward model's score and the rule's reward against
KL from the start, Gao et al.) is in the run's metrics and its report. A second run trains on the rule
itself, the ceiling to compare with. Held-out evaluation scores by the rule in both.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path
from typing import Any

from schedrl.envs import make_task
from schedrl.envs.base import Task

SORT = {"name": "sort", "args": {"min_len": 2, "max_len": 3}}


# what a policy can write besides digits: any printable character of the char tokenizer
NOISE = string.digits + string.ascii_letters + string.punctuation + " "


def mistake(task: Task, rng: random.Random) -> str:
    """A wrong answer of one of six kinds: another order, a digit changed, dropped or repeated, digits
    unrelated to the prompt (what an untrained policy says), or characters that are not all digits (what
    a policy drifting from its start says: a reward model that never saw them scores them at random, and
    GRPO finds the ones it scores high). Half the changed and unrelated ones are put in order, so that
    being sorted alone does not make an answer look right."""
    answer = task.answer
    digits = list(answer)
    for _ in range(20):
        kind = rng.randrange(6)
        if kind == 5:
            wrong = [rng.choice(NOISE) for _ in range(rng.randint(1, 4))]
            if any(c not in string.digits for c in wrong):
                return "".join(wrong)
            continue
        if kind == 4:
            wrong = [rng.choice("0123456789") for _ in range(rng.randint(1, 4))]
            wrong = sorted(wrong) if rng.random() < 0.5 else wrong
            if "".join(wrong) != answer:
                return "".join(wrong)
            continue
        if kind == 0 and len(set(digits)) > 1:
            wrong = digits[:]
            while wrong == digits:
                rng.shuffle(wrong)
        elif kind == 1:
            wrong = digits[:]
            i = rng.randrange(len(wrong))
            wrong[i] = rng.choice([d for d in "0123456789" if d != wrong[i]])
            wrong = sorted(wrong) if rng.random() < 0.5 else wrong
        elif kind == 2 and len(digits) > 1:
            wrong = digits[:]
            del wrong[rng.randrange(len(wrong))]
        else:
            wrong = digits[:]
            i = rng.randrange(len(wrong))
            wrong.insert(i, wrong[i])
        if "".join(wrong) != answer:
            return "".join(wrong)
    return answer + "0"


def write_pairs(path: Path, n: int, seed: int) -> None:
    """`n` preference pairs from the sort task's training prompts (module doc)."""
    source = make_task(SORT["name"], **SORT["args"])
    rng = random.Random(seed)
    tasks = source.sample("train", n, seed)
    rows = [
        {"id": f"{t.id}-{i}", "prompt": t.prompt, "chosen": t.answer, "rejected": mistake(t, rng)}
        for i, t in enumerate(tasks)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def rlhf_recipe(demo: dict[str, Any], rm_path: str, kl_coef: float) -> dict[str, Any]:
    """The sort demo's recipe with the reward model as the only reward and a KL penalty to the start."""
    return {
        **demo,
        "min_start_reward": -1e9,  # a reward model's scale has no floor to warn at
        "task": {**SORT, "reward_model": {"path": rm_path, "weight": 1.0, "rule_weight": 0.0}},
        "algo": {**demo.get("algo", {}), "kl_coef": kl_coef},
    }
