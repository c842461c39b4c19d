"""The learner's ranks as Ray actors in one placement group (`learner.parallel` on the Ray backend).

`RayLearnerRanks` is what the Ray backend starts as the learner when `learner.ranks` is more than one:
an actor holding no CPU of its own that reserves a placement group of `learner.ranks` bundles of
`pipeline.learner_cpus` each (on the nodes labelled `pipeline.learner_node`, if set), starts one
`RankActor` in each bundle, and hands every call to every rank, returning rank 0's answer, as
`LearnerRanks` does with local processes. Rank 0's actor names the address of the process group
(its node's address and a free port); the ranks join it with gloo (NCCL on GPUs).

A rank whose actor dies (its process killed, its node gone) fails the call naming the rank; the
run stops, and `--resume` continues from the last complete checkpoint on whatever nodes then carry
the label.
"""

from __future__ import annotations

from typing import Any

import torch

from schedrl.config import RunConfig
from schedrl.distributed.errors import WorkerDiedError
from schedrl.distributed.learner_ranks import RankGroup, free_port
from schedrl.distributed.workers import LearnerWorker, busy_stacks
from schedrl.training.parallel import Ranks, init_group

NODE_LABEL = "schedrl-node"  # the Ray node label `pipeline.engine_node` and `pipeline.learner_node` name
POLL_S = 1.0
READY_S = 300.0  # how long the placement group may wait for its CPUs


class RankActor:
    """One rank of the learner: a `LearnerWorker` joined to the group."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.worker: LearnerWorker | None = None

    def address(self) -> tuple[str, int]:
        """Where the group meets: this node's address and a free port (asked of rank 0)."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def start(self, host: str, port: int, cfg: RunConfig, run_root: str, checkpoint: str | None) -> None:
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        init_group(self.rank, self.world, port, device, host)
        ranks = Ranks(self.rank, self.world, cfg.learner.parallel)
        self.worker = LearnerWorker(cfg, run_root, checkpoint, None, cfg.pipeline.learner_cpus, ranks)

    def call(self, method: str, *args: Any) -> Any:
        assert self.worker is not None
        out = getattr(self.worker, method)(*args)
        return out if self.rank == 0 else None

    def stop(self) -> None:
        torch.distributed.barrier()  # every rank done with the group before any leaves it
        torch.distributed.destroy_process_group()


class RayLearnerRanks(RankGroup):
    """`cfg.learner.ranks` rank actors in one placement group, called as one learner worker."""

    def __init__(
        self, cfg: RunConfig, run_root: str, checkpoint: str | None, cores=None, threads=None
    ) -> None:
        import ray
        import ray.exceptions
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        world, cpus = cfg.learner.ranks, cfg.pipeline.learner_cpus
        node = cfg.pipeline.learner_node
        self.ray, self.errors = ray, ray.exceptions
        self.group = placement_group(
            [{"CPU": cpus}] * world,
            strategy="PACK",
            bundle_label_selector=[{NODE_LABEL: node}] * world if node else [],
        )
        ready, _ = ray.wait([self.group.ready()], timeout=READY_S)
        if not ready:
            where = f" on nodes labelled {NODE_LABEL}={node}" if node else ""
            raise WorkerDiedError(
                f"the learner's {world} ranks x {cpus} CPUs could not be placed{where} within {READY_S:.0f} s"
            )
        actor = ray.remote(num_cpus=cpus, max_restarts=0)(RankActor)
        self.ranks: list[Any] = [
            actor.options(scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, i)).remote(
                i, world
            )
            for i in range(world)
        ]
        host, port = self._gather([self.ranks[0].address.remote()], "starting the learner ranks")
        start = [r.start.remote(host, port, cfg, run_root, checkpoint) for r in self.ranks]
        self._gather(start, "starting the learner ranks")

    def _gather(self, refs: list, what: str) -> Any:
        """Every rank's answer; rank 0's value. A rank whose actor died raises `WorkerDiedError`."""
        pending = list(refs)
        while pending:
            done, pending = self.ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            for ref in done:
                try:
                    self.ray.get(ref)
                except (self.errors.RayActorError, self.errors.ActorUnavailableError) as err:
                    rank = refs.index(ref)
                    self.close()
                    raise WorkerDiedError(
                        f"learner rank {rank} died while {what} ({str(err).splitlines()[0]})"
                    ) from err
                except self.errors.RayTaskError as err:
                    raise RuntimeError(f"learner rank {refs.index(ref)} failed while {what}:\n{err}") from err
        return self.ray.get(refs[0])

    def _call(self, method: str, *args: Any) -> Any:
        return self._gather([r.call.remote(method, *args) for r in self.ranks], f"running {method}")

    def stacks(self) -> str:
        return f"learner ranks (Ray actors in placement group {self.group.id.hex()}); the coordinator:\n{busy_stacks()}"

    def close(self) -> None:
        """Stop the ranks and give their CPUs back."""
        if not self.ranks:
            return
        stops = [r.stop.remote() for r in self.ranks]
        self.ray.wait(stops, num_returns=len(stops), timeout=10.0)
        for r in self.ranks:
            self.ray.kill(r)
        self.ranks = []
        self.ray.util.remove_placement_group(self.group)
