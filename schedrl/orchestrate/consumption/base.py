"""The consumption protocol: which complete groups form the next update's batch.

`schedule.consumption` names one policy of `CONSUMPTION` (its arguments: `schedule.consumption_args`). The pipeline keeps its
unconsumed groups in issue order (the queue); a policy says where a new group stands in
the order of consumption (for the admission rule `staleness.may_admit`) and which groups
the next update takes. A policy may also shape the batches it is given (`plan`: how many
responses each task is sampled, how many of them the group needs) and abandon groups after a
take (`drop`): `Defaults` gives the plain answer to both, for policies that do neither.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from schedrl.envs import Task
from schedrl.orchestrate.buffer import Group
from schedrl.registry import Registry

Draw = Callable[[int], list[tuple[Task, int]]]  # the data scheduler: samples wanted -> [(task, n)]


class Consumption(Protocol):
    """Built as `cls(budget)`, or `cls(budget, args)` for a policy that declares `Args` (`budget`: samples
    per update), by `CONSUMPTION.build(name, args, budget)`."""

    off_policy: bool  # whether an update may train on groups admitted for an earlier one

    def position(self, queue: Sequence[Group], group: Group) -> tuple[int, int]:
        """(ahead, per_update): the work queued ahead of `group` and how much of it one update
        consumes, in one unit, so that `started + ahead // per_update` is the update that takes it."""
        ...

    def take(self, queue: Sequence[Group]) -> list[Group] | None:
        """The groups of the next update, or None while they are not ready. A group that finished more
        samples than it needs trains on the first `need` to finish (`Group.trim`)."""
        ...

    def plan(self, draw: Draw, wave: int) -> list[tuple[Task, int, int]] | None:
        """Batch `wave`: (task, requests, samples it needs) each, drawn with `draw` or not; None while
        the policy cannot yet say (the pipeline asks again after the next take)."""
        ...

    def drop(self, queue: Sequence[Group]) -> list[Group]:
        """Groups to abandon after a take: their requests are aborted and the groups forgotten."""
        ...

    def max_requests(self, samples: int) -> int:
        """The most requests `plan` gives a task the data scheduler drew `samples` samples of."""
        ...

    def metrics(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Defaults:
    """The plain answers: a step's batch as the data scheduler draws it, whole groups, no state."""

    budget: int

    def plan(self, draw: Draw, wave: int) -> list[tuple[Task, int, int]] | None:
        return [(task, n, n) for task, n in draw(self.budget)]

    def drop(self, queue: Sequence[Group]) -> list[Group]:
        return []

    def max_requests(self, samples: int) -> int:
        return samples

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


CONSUMPTION: Registry[type] = Registry("consumption policy")


def size(group: Group) -> int:
    """Samples a group still holds or will hold (its stale drops left out)."""
    return group.needed - len(group.dropped)
