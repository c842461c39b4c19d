"""`lookup` (sub-agents): the main agent needs values that only a sub-agent, in a context of its own, can
read.

The episode starts with the keys to find (letters): ``"find k,z:"``. The main agent asks for one key per
turn, ``"ask k;"``. The environment opens a sub-agent (`StepResult.context: branch`) whose prompt is a
document the main agent never sees: a table of entries, ``"b=1 k=7 z=3 p=5. k?"``, or (`document: log`)
the key's log of settings, the last one holding, ``"k=3 k=5 k=7. k?"``; the sub-agent answers with a digit,
``"7;"``, and the environment returns that answer (the first digit the sub-agent wrote, ``?`` for none) to
the main agent (`context: return`): ``" got 7:"``.
Once every key is asked, the main agent answers with the values in order, ``"73;"``.

Each context (the main agent's and each sub-agent's) trains as a segment of the episode, and all share
its reward: 1 for the right final answer, plus `lookup_reward` for each sub-agent answer that is right.

The supervised warm-up trains on the main agent's transcript (`solution`) and on each sub-agent's
(`contexts`), each in its own context, as the episode runs them.
"""

from __future__ import annotations

import random
import string

from schedrl.envs.base import GeneratedTasks, Task, TaskSource, check_int_range, task_id
from schedrl.envs.environment import Observation, StepResult

END = ";"
DOCUMENTS = ("table", "log")


def _name(rng: random.Random) -> str:
    return rng.choice(string.ascii_lowercase)


def _said(action: str) -> str:
    return action.strip().removesuffix(END).strip()


class LookupTask(GeneratedTasks):
    """`keys` keys to find, each in a document of `entries` name=digit entries (`document: table`), or of
    `entries` settings of the key itself, the last one holding (`document: log`)."""

    name = "lookup"

    def __init__(self, keys: int = 2, entries: int = 4, document: str = "table") -> None:
        self.keys = check_int_range(self.name, "keys", keys, 1, 4)
        self.entries = check_int_range(self.name, "entries", entries, 2, 12)
        if document not in DOCUMENTS:
            raise ValueError(
                f"task 'lookup': document must be one of {', '.join(DOCUMENTS)}, got {document!r}"
            )
        self.document = document

    def candidate(self, rng: random.Random) -> Task | None:
        names: list[str] = []
        while len(names) < self.keys + self.entries:
            n = _name(rng)
            if n not in names:
                names.append(n)
        keys, others = names[: self.keys], names[self.keys :]
        docs, values = {}, {}
        for k in keys:
            if self.document == "log":  # the key set `entries` times; the last one holds
                entries = [f"{k}={rng.randrange(10)}" for _ in range(self.entries)]
                values[k] = entries[-1][-1]
            else:
                values[k] = str(rng.randrange(10))
                entries = [
                    f"{k}={values[k]}",
                    *(f"{o}={rng.randrange(10)}" for o in rng.sample(others, self.entries - 1)),
                ]
                rng.shuffle(entries)
            docs[k] = " ".join(entries) + f". {k}?"
        prompt = f"find {','.join(keys)}:"
        meta = {"docs": docs, "values": values}
        key = prompt + str(docs)
        return Task(
            task_id("lookup", key), prompt, "".join(values[k] for k in keys), domain=self.name, metadata=meta
        )

    def split_key(self, task: Task) -> str:
        """Both splits ask for every letter: the split is by the documents, not the keys."""
        return task.id

    def reward(self, task: Task, completion: str) -> float:
        """The main agent's transcript: 1 when its final answer is every value in order."""
        parts = [p for p in completion.split(END) if p.strip()]
        return float(bool(parts) and parts[-1].rsplit(":", 1)[-1].strip() == task.answer)

    def solution(self, task: Task) -> str:
        """The main agent's transcript of a perfect episode: each ask, its answer, then the values."""
        keys = task.prompt.removeprefix("find ").removesuffix(":").split(",")
        return (
            "".join(f"ask {k}{END} got {v}:" for k, v in zip(keys, task.answer, strict=True))
            + task.answer
            + END
        )

    def contexts(self, task: Task) -> list[tuple[str, str]]:
        """The sub-agents' transcripts of a perfect episode, one per key: its document, then the value."""
        return [(doc, task.metadata["values"][k] + END) for k, doc in task.metadata["docs"].items()]


class LookupEnv:
    """A `LookupTask` episode: a sub-agent per ask, reading the document the main agent never sees."""

    stop_strings: tuple[str, ...] = (END,)

    def __init__(self, source: TaskSource, lookup_reward: float = 0.1) -> None:
        if not 0.0 <= lookup_reward < 1.0:
            raise ValueError(f"LookupEnv.lookup_reward must be in [0, 1), got {lookup_reward!r}")
        self.source, self.lookup_reward = source, lookup_reward
        self.docs: dict[str, str] = {}
        self.values: dict[str, str] = {}
        self.answer, self.asks = "", 0
        self.asking: str | None = None  # the key a sub-agent is reading, while one is open

    async def reset(self, task: Task, seed: int) -> Observation:
        self.docs, self.values = dict(task.metadata["docs"]), dict(task.metadata["values"])
        self.answer, self.asking, self.asks = task.answer, None, 0
        return Observation(task.prompt, "template")

    async def step(self, action: str) -> StepResult:
        said = _said(action)
        if self.asking is not None:  # the sub-agent's answer, its first digit, goes back to the main agent
            key, self.asking = self.asking, None
            said = next((c for c in said if c.isdigit()), "?")
            right = said == self.values[key]
            return StepResult(
                Observation(f" got {said}:", "env"), self.lookup_reward * right, False, context="return"
            )
        if said.startswith("ask "):
            key = said.removeprefix("ask ").strip()
            self.asks += 1
            if key not in self.docs or self.asks > 2 * len(self.docs):
                return StepResult(Observation(" no such key:", "env"), 0.0, False)
            self.asking = key
            return StepResult(Observation(self.docs[key], "env"), 0.0, False, context="branch")
        return StepResult(None, float(said == self.answer), done=True)

    async def close(self) -> None:
        return None
