"""The one loop: the schedule's decisions, written once for training and for the simulator.

The loop keeps the books and leaves every what-runs-when decision to a policy of the schedule:

* admission: buffered groups go to the engines, in issue order, while the update expected to consume
  each (after `started` and the groups ahead of it, as the consumption policy counts them) is at most
  `engine version + k` (`staleness.may_admit`); when all are admitted, the next batch is drawn as soon
  as its first group may go (so the data scheduler has seen every batch trained before it);
* consumption: when the learner may take an update, samples too stale for it are purged
  (`StalenessBound.trainable`; a group left with fewer than two is spent), and the consumption policy
  takes the next batch and says which groups it abandons;
* weight sync: when an update ends, the weight-sync policy decides when its weights reach the engines
  and what happens to the requests they hold;
* delayed rewards: a task whose outcome is known only later (forecasting) has its finished samples held
  unscored in their group until the batch that resolves it is drawn; the world's clock is the batches
  drawn, so a run draws `horizon` batches past its last update's for its last questions to resolve.

What runs is a `Cluster`, engines and a learner on one clock:

* `orchestrate.sync.StepCluster`: this process's engine and learner, no threads; a poll generates every
  admitted request to the end (in the schedule's rollout mode), or runs the launched update. Under the
  schedule's defaults (k = 0, `wave`, `drain`) it is the synchronous on-policy loop;
* `orchestrate.pipeline.Pipeline`: engine and learner workers on the local, threads or Ray backend;
  a poll waits for their calls (the asynchronous pipeline);
* `sim.cluster.ClusterSim`: the simulator's engines and the learner's cost model on a virtual clock; a
  poll takes the next event off a heap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from schedrl.config import Schedule
from schedrl.orchestrate.buffer import Group
from schedrl.orchestrate.schedule import make_bound, make_consumption, make_weight_sync
from schedrl.orchestrate.staleness import expected_update, may_admit


@dataclass(frozen=True)
class Finished:
    """An update the learner finished: its metrics and the new weights (None on the virtual clock)."""

    stats: dict[str, float]
    weights: Any = None


class Cluster(Protocol):
    """Engines and a learner on one clock, as the loop drives them. A group has `id`, `wave`,
    `requests`, `admitted`, `done` and `dropped` (by sample index), `needed`, `complete` and `trim()`
    (`orchestrate.buffer.Group`); a sample has `request_id`, `versions` and `trained`."""

    fleet: Any  # the engines as the weight-sync policy acts on them (`contracts.Fleet`)

    def issue(self, wave: int, consumption: Any) -> list[Any] | None:
        """The groups of batch `wave`, as the consumption policy plans it (None: not yet)."""
        ...

    def send(self, groups: list[Any]) -> None:
        """The requests of groups admitted now, to the engines."""
        ...

    def resume(self) -> None:
        """Every cut request back to the engines, to continue from its prefix."""
        ...

    def let_go(self, spent: list[Any]) -> None:
        """Groups a purge left without a baseline: their unfinished requests are not needed."""
        ...

    def may_launch(self) -> bool:
        """Whether the learner takes another update now."""
        ...

    def launch(self, taken: list[Any], dropped: list[Any], update: int) -> None:
        """Start update `update` on the `taken` groups; the `dropped` groups are abandoned."""
        ...

    def poll(self) -> Finished | None:
        """Wait for the next thing to happen (samples reach their groups through `Loop.finish`); the
        update that finished, if one did."""
        ...

    def on_update(self, finished: Finished, version: int) -> None:
        """After the weight-sync policy has had update `version`: metrics, evaluation, checkpoints."""
        ...

    def score(self, held: list[tuple[Any, int, Any]]) -> None:
        """Held samples (group, index, sample) whose outcome is now known: score each and hand it to
        `Loop.finish` (now, or when its reward comes back)."""
        ...


class Loop:
    """The books of a run: the unconsumed groups in issue order, the updates started and finished, the
    sample ledger (consumed groups, dropped samples, abandoned requests)."""

    def __init__(
        self,
        schedule: Schedule,
        per_update: int,
        updates: int,
        cluster: Cluster,
        start: int = 0,
        horizon: int = 0,
    ):
        self.schedule, self.updates, self.cluster = schedule, updates, cluster
        self.horizon = horizon  # batches drawn past the last update's, for delayed rewards to resolve
        self.consumption = make_consumption(schedule, per_update)
        self.weight_sync = make_weight_sync(schedule)
        self.bound = make_bound(schedule)
        self.version = self.started = start  # updates finished / started
        self.groups: dict[str, Any] = {}
        self.next_wave = 0  # batches issued so far
        self.consumed: list[str] = []  # ids of consumed groups, in order
        self.dropped: list[str] = []  # ids of samples dropped as too stale
        self.abandoned = 0  # requests let go for good: spares, dropped and spent groups
        self.dirty = True  # something changed that a turn may act on
        self.turns = 0
        self.completed: list[Any] = []  # groups completed since the last purge
        self.purged: tuple[int, int] | None = None  # (update, k) all complete groups were last purged for

    def run(self) -> None:
        while self.version < self.updates:
            if self.dirty:
                self.turn()
            finished = self.cluster.poll()
            if finished is not None:
                self.version += 1
                self.weight_sync.on_update(
                    self.cluster.fleet, finished.weights, self.version, self.cluster.resume
                )
                self.cluster.on_update(finished, self.version)
                self.dirty = True

    def turn(self) -> None:
        """Admit; start the next update if its batch is ready; admit into the room that made."""
        self.dirty, self.turns = False, self.turns + 1
        self.admit()
        dropped = len(self.dropped)
        if self.launch() or len(self.dropped) != dropped:
            self.admit()

    def finish(self, group: Any, index: int, sample: Any) -> None:
        """Sample `index` of a buffered group finished: scored (on the real clock), or, while its group's
        outcome is not known, held unscored."""
        if self.holds(group) and sample.reward is None:
            group.waiting[index] = sample
            return
        group.done[index] = sample
        if group.complete:
            self.completed.append(group)
            self.dirty = True

    def holds(self, group: Any) -> bool:
        """Whether `group`'s outcome is still unknown: the batch that resolves it is not drawn yet."""
        return group.resolves >= self.next_wave

    def held(self) -> int:
        """Finished samples waiting for their outcome."""
        return sum(len(g.waiting) for g in self.groups.values())

    def admit(self) -> None:
        if not self.weight_sync.admits(self.cluster.fleet):
            return
        out, queue, i = [], list(self.groups.values()), 0
        while True:
            while i < len(queue) and queue[i].admitted:
                i += 1
            if i == len(queue):  # a batch is drawn only once its first group may go (it sees the last)
                probe = Group("next", None, [], wave=self.next_wave)
                if not self.admissible([*queue, probe], probe) or not self.issue():
                    break
                queue = list(self.groups.values())
                continue
            if not self.admissible(queue, queue[i]):
                break
            queue[i].admitted = True
            out.append(queue[i])
        if out:
            self.cluster.send(out)

    def admissible(self, queue: list[Any], group: Any) -> bool:
        """Whether `group` (in `queue`) may go to the engines behind the groups ahead of it."""
        ahead, per_update = self.consumption.position(queue, group)
        return expected_update(self.started, ahead, per_update) < self.updates + self.horizon and may_admit(
            self.started, ahead, per_update, self.cluster.fleet.version, self.bound.k
        )

    def issue(self) -> bool:
        groups = self.cluster.issue(self.next_wave, self.consumption)
        if groups is None:
            return False
        self.groups.update((g.id, g) for g in groups)
        self.next_wave += 1
        due = [g for g in self.groups.values() if g.waiting and not self.holds(g)]
        if due:  # the draw resolved their outcomes
            held = [(g, i, s) for g in due for i, s in g.waiting.items()]
            for g in due:
                g.waiting = {}
            self.cluster.score(held)
        return True

    def purge(self, update: int) -> None:
        """Drop every finished sample `update` may not train on; a group left with fewer than two is spent.
        Only groups completed since the last purge are looked at, unless the update or k moved."""
        if (update, self.bound.k) != self.purged:
            check = [g for g in self.groups.values() if g.admitted and g.complete]
            self.purged = (update, self.bound.k)
        else:
            check = list({g.id: g for g in self.completed if g.id in self.groups}.values())
        self.completed, spent = [], []
        for g in check:
            for i, sample in list(g.done.items()):
                stale = self.schedule.stale  # a folded episode trains whole or not at all: every segment
                if any(
                    self.bound.trainable(update, r.versions, stale, r.trained) is None for r in sample.rows()
                ):
                    del g.done[i]
                    g.dropped.append(i)
                    self.dropped.append(sample.request_id)
            if g.needed - len(g.dropped) < 2:
                self.dropped += [s.request_id for s in g.done.values()]
                self.abandoned += len(g.requests) - len(g.done) - len(g.dropped)
                del self.groups[g.id]
                spent.append(g)
        if spent:
            self.cluster.let_go(spent)

    def launch(self) -> bool:
        """Start the next update if the learner may take it and the consumption policy hands it a batch.
        A taken group trains on the first `needed` samples to finish."""
        if self.started >= self.updates or not self.cluster.may_launch():
            return False
        self.purge(self.started)
        taken = self.consumption.take(list(self.groups.values()))
        if taken is None:
            return False
        for g in taken:
            del self.groups[g.id]
            g.trim()
            self.consumed.append(g.id)
        dropped = self.consumption.drop(list(self.groups.values()))
        for g in dropped:
            del self.groups[g.id]
        self.abandoned += sum(len(g.requests) - g.needed for g in taken) + sum(
            len(g.requests) for g in dropped
        )
        self.cluster.launch(taken, dropped, self.started)
        self.started += 1
        return True

    # ---- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "version": self.version,
            "next_wave": self.next_wave,
            "bound": self.bound.state_dict(),
            "groups": [g.to_dict() for g in self.groups.values()],
            "consumed": self.consumed,
            "dropped": self.dropped,
            "consumption": self.consumption.state_dict(),
            "abandoned": self.abandoned,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the books from a checkpoint; every group comes back not admitted (nothing is in a
        fresh engine: admission sends them again, in order)."""
        if state["version"] != self.version:
            raise ValueError(
                f"pipeline state is for version {state['version']}, the checkpoint for {self.version}"
            )
        self.next_wave = state["next_wave"]
        self.bound.load_state_dict(state["bound"])
        self.groups = {}
        for d in state["groups"]:
            g = Group.from_dict(d)
            g.admitted = False
            self.groups[g.id] = g
        self.consumed, self.dropped = list(state["consumed"]), list(state["dropped"])
        self.consumption.load_state_dict(state.get("consumption", {}))
        self.abandoned = int(state.get("abandoned", 0))
        self.purged = None
