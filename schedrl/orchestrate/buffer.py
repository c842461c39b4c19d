"""The trajectory buffer of the asynchronous pipeline: groups from issue to consumption.

A group is the G samples of one task. It is issued (its requests exist), admitted
(they were sent to the engine), complete (all G samples finished and scored), then
consumed by one update or dropped. Samples cut by an abort wait in ``partial`` and
resume from their prefix, within the original token budget. A task whose reward resolves later
(forecasting) holds its finished samples in ``waiting``, unscored, until the batch that resolves it
is drawn (`orchestrate.loop.Loop`). Everything here is plain
data and serialises to JSON, so a checkpoint carries the whole buffer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from schedrl.envs import Task
from schedrl.types import Request, Sample, SamplingParams


def _params(d: dict) -> SamplingParams:
    return SamplingParams(
        **{**d, "stop_token_ids": tuple(d["stop_token_ids"]), "stop_strings": tuple(d["stop_strings"])}
    )


def request_to_dict(r: Request) -> dict:
    return asdict(r)


def request_from_dict(d: dict) -> Request:
    tuples = ("prompt_ids", "prefix_ids", "prefix_logprobs", "prefix_versions")
    return Request(**{**d, "params": _params(d["params"]), **{k: tuple(d[k]) for k in tuples}})


def sample_to_dict(s: Sample) -> dict:
    d = asdict(s)
    del d["timings"]  # wall-clock stamps of another process; meaningless after a restart
    d["segments"] = [sample_to_dict(x) for x in s.segments]
    return d


def sample_from_dict(d: dict) -> Sample:
    tuples = ("prompt_ids", "token_ids", "logprobs", "versions")
    optional = {
        k: tuple(d[k]) if d.get(k) is not None else None for k in ("trained", "turns", "turn_rewards")
    }
    return Sample(
        **{
            **d,
            "params": _params(d["params"]),
            **{k: tuple(d[k]) for k in tuples},
            **optional,
            "segments": tuple(sample_from_dict(x) for x in d.get("segments", ())),
        }
    )


@dataclass
class Group:
    id: str
    task: Any  # a Task (the simulator's: the lengths drawn for the prompt)
    requests: list[Any]  # the original requests (`Request`s), by sample index
    wave: int = 0  # the data-scheduler batch it came from
    admitted: bool = False
    done: dict[int, Any] = field(default_factory=dict)  # finished (and scored) samples, by sample index
    partial: dict[int, Sample] = field(default_factory=dict)  # cut by an abort, waiting to resume
    dropped: list[int] = field(default_factory=list)  # finished, then dropped as too stale to train on
    need: int = 0  # finished samples that complete it (0: every request); the rest are spares
    # delayed rewards: the batch whose draw resolves its task's outcome (-1: known at once), and its
    # finished samples held unscored until then, by sample index
    resolves: int = -1
    waiting: dict[int, Sample] = field(default_factory=dict)

    @property
    def needed(self) -> int:
        return self.need or len(self.requests)

    @property
    def complete(self) -> bool:
        return len(self.done) + len(self.dropped) >= self.needed

    def trim(self) -> None:
        """Keep the first `needed` samples to finish (`done` is in finishing order); spares are dropped."""
        keep = list(self.done)[: self.needed - len(self.dropped)]
        self.done = {i: self.done[i] for i in keep}

    def to_send(self) -> list[Request]:
        """Requests for every sample that is neither done nor in the engine: fresh, or resumed from a prefix."""
        return [
            self.resume(r.sample_index)
            for r in self.requests
            if r.sample_index not in self.done
            and r.sample_index not in self.dropped
            and r.sample_index not in self.waiting
        ]

    def resume(self, index: int) -> Request:
        """The request of sample `index`: resumed from its cut prefix (taken out of `partial`), if any."""
        cut = self.partial.pop(index, None)
        if cut is not None and cut.token_ids:
            return Request.resume(cut)
        return next(r for r in self.requests if r.sample_index == index)

    def samples(self) -> list[Sample]:
        return [self.done[i] for i in sorted(self.done)]

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "task": asdict(self.task),
            "wave": self.wave,
            "admitted": self.admitted,
            "requests": [request_to_dict(r) for r in self.requests],
            "done": {str(i): sample_to_dict(s) for i, s in self.done.items()},
            "partial": {str(i): sample_to_dict(s) for i, s in self.partial.items()},
            "dropped": self.dropped,
            "need": self.need,
            "resolves": self.resolves,
            "waiting": {str(i): sample_to_dict(s) for i, s in self.waiting.items()},
        }

    @classmethod
    def from_dict(cls, d: dict) -> Group:
        return cls(
            d["id"],
            Task(**d["task"]),
            [request_from_dict(r) for r in d["requests"]],
            d["wave"],
            d["admitted"],
            {int(i): sample_from_dict(s) for i, s in d["done"].items()},
            {int(i): sample_from_dict(s) for i, s in d["partial"].items()},
            list(d["dropped"]),
            int(d.get("need", 0)),
            int(d.get("resolves", -1)),
            {int(i): sample_from_dict(s) for i, s in d.get("waiting", {}).items()},
        )
