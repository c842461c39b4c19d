"""Multi-turn episodes behind the `Engine` protocol: what the asynchronous pipeline's engine workers run.

A request is an episode: `add` starts it (its task from `set_tasks`), `step` hands over the
environments' answers and runs one step of the inner engine, and returns the episodes that ended,
each a finished sample with its environment's reward, its ledger and the mask of its trained
tokens. `abort` suspends an episode: its model turn leaves the engine with what it generated and
its environment's answer waits; the sample it returns is empty, so the pipeline sends the original
request again, and `add` of a suspended episode's id resumes it exactly where it was cut (the cut
turn from its tokens, the same seeds). `discard` ends an episode for good instead (tail batching's
spares and dropped groups): its environment closes and nothing of it comes back. A turn boundary is
therefore no different from any other point for a weight update: every token carries the version
that sampled it.

An episode cut by a checkpoint resumes in the same process; one that was in flight when the process
died starts again from its reset after the restart (an environment's state, a tool's session, does
not survive a process), and the ledger of consumed groups still holds every trained sample once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import torch

from schedrl.engine.base import run_to_completion
from schedrl.envs.base import Task
from schedrl.rollout.episodes import EpisodeRunner
from schedrl.types import Request, Sample


class EpisodeEngine:
    def __init__(self, runner: EpisodeRunner) -> None:
        self.runner, self.engine = runner, runner.engine
        self.tasks: dict[str, Task] = {}
        self.on_token = self.on_finish = None

    @property
    def version(self) -> int:
        return self.engine.version

    @version.setter
    def version(self, v: int) -> None:
        self.engine.version = v

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.engine.eos_ids

    def set_tasks(self, tasks: Mapping[str, Task]) -> None:
        """The tasks of the episodes about to be added (an environment resets on its task; a started
        episode holds its own, so only the latest call's are kept)."""
        self.tasks = dict(tasks)

    def add(self, request: Request) -> None:
        if self.runner.is_suspended(request.id):
            self.runner.resume(request.id)
            return
        if request.task_id not in self.tasks:
            raise ValueError(f"episode {request.id!r}: task {request.task_id!r} was not given (set_tasks)")
        # a fresh start: an episode's cut tokens never leave this process (its sample was empty)
        fresh = Request(request.id, request.prompt_ids, request.params, **_ids(request))
        self.runner.start([fresh], self.tasks)

    def step(self) -> list[Sample]:
        if not self.runner.has_unfinished():
            return []
        return [self.runner.sample(ep) for ep in self.runner.advance()]

    def abort(self, request_id: str) -> Sample:
        return _aborted(self.runner.suspend(request_id).request)

    def discard(self, request_id: str) -> Sample | None:
        """End the episode for good, suspended or not (`EpisodeRunner.discard`): nothing of it resumes or
        comes back. Its empty aborted sample; None if it is not here (it ended)."""
        ep = self.runner.discard(request_id)
        return None if ep is None else _aborted(ep.request)

    def update_weights(
        self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        self.engine.update_weights(weights, version)

    def has_unfinished(self) -> bool:
        return self.runner.has_unfinished()

    def generate(
        self, requests: Sequence[Request], on_step: Callable[[list[Sample]], None] | None = None
    ) -> list[Sample]:
        return run_to_completion(self, requests, on_step)

    @property
    def waiting_ids(self) -> list[str]:
        """Episodes waiting on their environment (or on the engine's queue: they hold no slot yet)."""
        return self.runner.waiting_ids()

    @property
    def running_ids(self) -> list[str]:
        """Episodes with a model turn in the engine."""
        return self.runner.in_engine_ids()

    @property
    def num_waiting(self) -> int:
        return len(self.waiting_ids)

    @property
    def num_running(self) -> int:
        return len(self.running_ids)


def _aborted(r: Request) -> Sample:
    """The empty sample an episode leaves when it is cut or discarded."""
    return Sample(r.id, r.prompt_ids, (), (), (), "aborted", r.params, **_ids(r))


def _ids(r: Request | Sample) -> dict:
    return {"task_id": r.task_id, "group_id": r.group_id, "sample_index": r.sample_index}
