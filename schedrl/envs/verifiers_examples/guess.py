"""Find a secret number in [0, high] from `+` (higher) and `-` (lower): a verifiers `MultiTurnEnv` whose
`env_response` answers each guess and sets `final_env_response` when it is right; reward 1 for a win."""

from __future__ import annotations

import random
import re

import verifiers as vf  # pyright: ignore[reportMissingImports]  # the verifiers extra
from datasets import Dataset


def load_environment(n: int = 500, high: int = 63, max_turns: int = 6, seed: int = 0) -> vf.Environment:
    rng = random.Random(seed)
    rows = [{"question": f"guess 0-{high}", "answer": str(rng.randint(0, high))} for _ in range(n)]

    class Guess(vf.MultiTurnEnv):
        async def env_response(self, messages, state, **kwargs):
            text = str(messages[-1].content or "")
            found = re.findall(r"-?\d+", text)
            secret = int(state["answer"])
            if found and int(found[-1]) == secret:
                state["final_env_response"] = [vf.UserMessage(content="=")]
                return state["final_env_response"]
            if not found:
                return [vf.UserMessage(content="?")]
            return [vf.UserMessage(content="+" if secret > int(found[-1]) else "-")]

    def won(state, **kwargs) -> float:
        return float(state.get("final_env_response") is not None)

    return Guess(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[won]), max_turns=max_turns)
