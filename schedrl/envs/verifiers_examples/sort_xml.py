"""Sort the digits, answered inside <answer>...</answer>: a verifiers `SingleTurnEnv` whose rubric
rewards the right answer (weight 1) and the answer format (weight 0.2). Its rows are the `sort` task's
prompts (`schedrl.envs.digits`), so it is generated, not downloaded."""

from __future__ import annotations

import verifiers as vf  # pyright: ignore[reportMissingImports]  # the verifiers extra
from datasets import Dataset

from schedrl.envs import make_task


def load_environment(n: int = 2000, min_len: int = 2, max_len: int = 3, seed: int = 0) -> vf.Environment:
    source = make_task("sort", min_len=min_len, max_len=max_len)
    rows = [
        {"question": t.prompt, "answer": t.answer}
        for split in ("train", "eval")
        for t in source.sample(split, n if split == "train" else max(1, n // 10), seed)
    ]
    parser = vf.XMLParser(fields=["answer"], answer_field="answer")

    def correct(completion, answer, **kwargs) -> float:
        return float((parser.parse_answer(completion) or "").strip() == answer)

    rubric = vf.Rubric(funcs=[correct, parser.get_format_reward_func()], weights=[1.0, 0.2], parser=parser)
    dataset = Dataset.from_list(rows[:n])
    eval_dataset = Dataset.from_list(rows[n:])
    return vf.SingleTurnEnv(dataset=dataset, eval_dataset=eval_dataset, parser=parser, rubric=rubric)
