"""`search_qa` (search self-play, generated): questions about a local corpus that only a search answers,
and the same policy proposing them.

The corpus is 300 generated records, one per made-up name: ``"kip: city oslo, pet yak."``. `search` is
the tool, BM25 over the corpus (the `bm25s` library; ``pip install 'schedrl[search]'``), answering with
the best record. Two roles share one policy and one run:

* solve: ``"city of kip?="``, answered by a search and then the value:
  ``<<search kip>>[kip: city oslo, pet yak.]oslo``; reward 1 for the right value after the last tool
  answer. The names are random, so no answer is known without the search.
* propose: ``"doc kip: city oslo, pet yak. ask city="``, answered with a question about that field of
  the record and its answer, ``city of kip?|oslo``; reward 1 when the proposal is verified against the
  corpus: it names the record and the field, the answer is that field's value and is not in the
  question, and searching the question finds that record. The field asked for is drawn with the task:
  left free, the tiny model's proposer settles on one kind of question and the solver learns only
  that one.

`sample` gives both roles, half and half (the supervised warm-up trains on both); the `self_play` data
scheduler (`schedrl.data.self_play`) trains the solver only on questions the policy proposed and the
corpus verified. The held-out evaluation (`rule_source`) is the solver's, on generated questions.

Reference: Lu et al., "Search Self-play: Pushing the Frontier of Agent Capability without Supervision"
(2025). Their proposer is also rewarded for questions the solver fails; here a verified question earns
its proposer 1.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass

from schedrl.envs.base import Task, check_count, check_split, split_of, stable_hash, task_id
from schedrl.envs.calc import final_answer

CITIES = ("oslo", "rome", "lima", "kyiv", "bonn", "nice", "riga", "fez")
PETS = ("yak", "cat", "owl", "dog", "emu", "eel", "ant", "fox")
FIELDS = {"city": CITIES, "pet": PETS}
CORPUS_SIZE = 300
LETTERS = "bcdfghjklmnprstvz"
VOWELS = "aeiou"
_PROPOSAL = re.compile(r"([a-z ]{1,40}\?)\|([a-z]{1,12})")


@dataclass(frozen=True)
class Record:
    name: str
    city: str
    pet: str

    @property
    def text(self) -> str:
        return f"{self.name}: city {self.city}, pet {self.pet}."


@functools.cache
def corpus() -> tuple[Record, ...]:
    """The records, the same in every process: names consonant-vowel-consonant, all different."""
    rng, names = random.Random(stable_hash("search_qa corpus")), set()
    reserved = {*FIELDS, *CITIES, *PETS, "doc", "ask"}  # a name is never a word of the templates
    while len(names) < CORPUS_SIZE:
        name = rng.choice(LETTERS) + rng.choice(VOWELS) + rng.choice(LETTERS)
        if name not in reserved:
            names.add(name)
    return tuple(Record(n, rng.choice(CITIES), rng.choice(PETS)) for n in sorted(names))


@functools.cache
def by_name() -> dict[str, Record]:
    return {r.name: r for r in corpus()}


@functools.cache
def _index():
    try:
        import bm25s
    except ImportError:
        raise ImportError("task 'search_qa' searches with bm25s: pip install 'schedrl[search]'") from None
    docs = [r.text for r in corpus()]
    index = bm25s.BM25()
    index.index(bm25s.tokenize(docs, stopwords=[], show_progress=False), show_progress=False)
    return bm25s, index


def _record(task: Task) -> Record:
    """The record a propose task shows."""
    return by_name()[task.metadata["name"]]


def top_record(query: str) -> Record | None:
    """The record BM25 ranks first for `query` (None when no word of it is in the corpus)."""
    bm25s, index = _index()
    tokens = bm25s.tokenize([query], stopwords=[], show_progress=False)
    if not any(len(ids) for ids in tokens.ids):
        return None
    ids, scores = index.retrieve(tokens, k=1, show_progress=False)
    return corpus()[int(ids[0][0])] if float(scores[0][0]) > 0 else None


def search(query: str) -> str:
    """Search the corpus; the best matching record.

    Args:
        query: words to look for, e.g. a name
    """
    hit = top_record(query)
    return hit.text if hit is not None else "no match"


def verify(proposal: str, doc: Record, field: str | None = None) -> tuple[str, str] | None:
    """(question, answer) when `proposal` ("city of kip?|oslo") is a question about `doc` (and `field`,
    if given) that the corpus answers: one record's name and one field in it, the answer that field's
    value and not in the question, and a search for the question finding that record; else None."""
    m = _PROPOSAL.fullmatch(proposal.strip())
    if m is None:
        return None
    question, answer = m.group(1), m.group(2)
    words = set(re.findall(r"[a-z]+", question))
    fields = [f for f in FIELDS if f in words]
    names = [w for w in words if w in by_name()]
    if len(fields) != 1 or names != [doc.name] or answer in words or field not in (None, fields[0]):
        return None
    if getattr(doc, fields[0]) != answer or top_record(question) != doc:
        return None
    return question, answer


class SearchQA:
    """Solve (search, then answer) and propose (a question the corpus verifies) tasks on one corpus."""

    name = "search_qa"

    def solve_task(self, question: str, answer: str) -> Task:
        """The solver's task for `question`; its kind is the field it asks for."""
        prompt = f"{question}="
        kind = next((f for f in FIELDS if f in question.split()), "")
        return Task(task_id("sq", prompt), prompt, answer, domain="solve", metadata={"kind": kind})

    def propose_task(self, record: Record, field: str) -> Task:
        prompt = f"doc {record.text} ask {field}="
        meta = {"name": record.name, "field": field}
        return Task(task_id("sp", prompt), prompt, "", domain="propose", metadata=meta)

    def _propose(self, rng: random.Random) -> Task:
        return self.propose_task(rng.choice(corpus()), rng.choice(list(FIELDS)))

    def _solve(self, rng: random.Random) -> Task:
        record, field = rng.choice(corpus()), rng.choice(list(FIELDS))
        return self.solve_task(f"{field} of {record.name}?", getattr(record, field))

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        """`n` tasks of `split`, solve and propose alternating; a question's split is its prompt's hash."""
        check_split(split)
        rng, out = random.Random(seed), []
        while len(out) < check_count(n):
            task = self._solve(rng) if len(out) % 2 == 0 else self._propose(rng)
            if split_of(task.prompt) == split:
                out.append(task)
        return out

    def propose(self, split: str, n: int, seed: int) -> list[Task]:
        """`n` propose tasks of `split`."""
        rng, out = random.Random(seed), []
        while len(out) < n:
            task = self._propose(rng)
            if split_of(task.prompt) == split:
                out.append(task)
        return out

    def proposal(self, task: Task, completion: str) -> Task | None:
        """The solve task a propose task's completion makes, if the corpus verifies it."""
        verified = verify(final_answer(completion), _record(task), task.metadata["field"])
        return None if verified is None else self.solve_task(*verified)

    def reward(self, task: Task, completion: str) -> float:
        if task.domain == "propose":
            return float(self.proposal(task, completion) is not None)
        return float(final_answer(completion) == task.answer)

    def solution(self, task: Task) -> str:
        if task.domain == "propose":
            record, field = _record(task), task.metadata["field"]
            return f"{field} of {record.name}?|{getattr(record, field)}"
        name = task.prompt.removesuffix("?=").rsplit(" ", 1)[-1]
        return f"<<search {name}>>[{search(name)}]{task.answer}"

    @property
    def rule_source(self) -> SolveOnly:
        return SolveOnly(self)


class SolveOnly:
    """The held-out judge of `search_qa`: the solver's questions only, generated from the corpus."""

    def __init__(self, source: SearchQA) -> None:
        self.source = source

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        rng, out = random.Random(seed), []
        while len(out) < check_count(n):
            task = self.source._solve(rng)
            if split_of(task.prompt) == split:
                out.append(task)
        return out

    def reward(self, task: Task, completion: str) -> float:
        return self.source.reward(task, completion)

    def solution(self, task: Task) -> str:
        return self.source.solution(task)
