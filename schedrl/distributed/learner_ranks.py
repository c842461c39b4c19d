"""The learner worker as `learner.ranks` processes in one process group (`learner.parallel`).

`LearnerRanks` answers the calls a `LearnerWorker` answers (`update`, `weights`, `save_checkpoint`,
`spans`, `stacks`), so every worker backend starts it where it would start one learner worker: in this
process (local, threads) or in a Ray actor. It spawns one process per rank on this machine, each a
`LearnerWorker` joined to the group (gloo on CPU, NCCL on CUDA, loopback only), hands every call to
every rank (each rank holds the whole batch and trains on its share: `training.parallel`) and
returns rank 0's answer. A rank that fails fails the call with its traceback; a rank that dies
fails it naming the rank and its exit code.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection
import socket
import traceback
from typing import Any, NoReturn

import torch
import torch.multiprocessing as mp

from schedrl.config import RunConfig
from schedrl.distributed.errors import WorkerDiedError
from schedrl.distributed.workers import LearnerWorker, busy_stacks
from schedrl.engine.weight_push import WeightPush
from schedrl.training.parallel import Ranks, init_group

POLL_S = 1.0  # how often a call waiting on the ranks checks that they are alive


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_cores(cores: list[int] | None, rank: int, world: int) -> list[int] | None:
    """Rank `rank`'s share of `cores` (None: unpinned)."""
    if not cores:
        return None
    share = [c for i, c in enumerate(cores) if i % world == rank]
    return share or [cores[rank % len(cores)]]


def rank_main(
    rank: int, world: int, port: int, cfg: RunConfig, run_root: str, checkpoint: str | None, cores, conn
) -> None:
    """One rank: join the group, build the learner worker, answer calls until told to stop."""
    try:
        device = torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        init_group(rank, world, port, device)
        threads = max(1, len(cores)) if cores else 1
        worker = LearnerWorker(
            cfg, run_root, checkpoint, cores, threads, Ranks(rank, world, cfg.learner.parallel)
        )
        conn.send(("ready", None))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        method, args = conn.recv()
        if method == "stop":
            torch.distributed.barrier()  # every rank done with the group before any leaves it
            break
        try:
            out = getattr(worker, method)(*args)
            conn.send(("ok", out if rank == 0 else None))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
    torch.distributed.destroy_process_group()


class RankGroup:
    """What a learner worker answers, for a group of ranks: every call goes to every rank (`_call`), and
    rank 0's answer comes back."""

    def _call(self, method: str, *args: Any) -> Any:
        raise NotImplementedError

    def update(self, batch, step: int):
        return self._call("update", batch, step)

    def weights(self, version: int) -> WeightPush:
        return self._call("weights", version)

    def save_checkpoint(self, step: int, state: dict) -> str:
        return self._call("save_checkpoint", step, state)

    def spans(self) -> list:
        return self._call("spans")


class LearnerRanks(RankGroup):
    """`cfg.learner.ranks` learner processes in one process group, called as one learner worker."""

    def __init__(
        self, cfg: RunConfig, run_root: str, checkpoint: str | None, cores=None, threads=None
    ) -> None:
        world = cfg.learner.ranks
        ctx = mp.get_context("spawn")
        port = free_port()
        self.conns, self.procs = [], []
        for rank in range(world):
            parent, child = ctx.Pipe()
            args = (rank, world, port, cfg, run_root, checkpoint, rank_cores(cores, rank, world), child)
            proc = ctx.Process(target=rank_main, args=args, daemon=True, name=f"learner-rank-{rank}")
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        self._gather("starting the learner ranks")

    def _gather(self, what: str) -> Any:
        """Every rank's answer to the last message; rank 0's value."""
        answers: dict[int, tuple[str, Any]] = {}
        while len(answers) < len(self.conns):
            waiting = {c: r for r, c in enumerate(self.conns) if r not in answers}
            for conn in multiprocessing.connection.wait(list(waiting), timeout=POLL_S):
                rank = waiting[conn]  # type: ignore[index]
                try:
                    answers[rank] = conn.recv()  # type: ignore[union-attr]
                except (EOFError, OSError):  # its end of the pipe closed: the process is gone
                    self._died(rank, what)
            for rank, proc in enumerate(self.procs):
                if rank not in answers and not proc.is_alive():
                    self._died(rank, what)
        errors = [(r, text) for r, (kind, text) in sorted(answers.items()) if kind == "error"]
        if errors:
            rank, text = errors[0]
            raise RuntimeError(f"learner rank {rank} failed while {what}:\n{text}")
        return answers[0][1]

    def _died(self, rank: int, what: str) -> NoReturn:
        self.procs[rank].join(timeout=5)
        code = self.procs[rank].exitcode
        self.close()
        raise WorkerDiedError(f"learner rank {rank} died while {what} (exit code {code})")

    def _call(self, method: str, *args: Any) -> Any:
        for rank, conn in enumerate(self.conns):
            try:
                conn.send((method, args))
            except OSError:
                self._died(rank, f"receiving {method}")
        return self._gather(f"running {method}")

    def stacks(self) -> str:
        pids = ", ".join(str(p.pid) for p in self.procs)
        return f"learner ranks (processes {pids}); the driver:\n{busy_stacks()}"

    def close(self) -> None:
        for conn, proc in zip(self.conns, self.procs, strict=True):
            if proc.is_alive():
                with contextlib.suppress(OSError):
                    conn.send(("stop", ()))
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def learner_class(cfg: RunConfig) -> type:
    """What a local or threads backend starts as the learner worker: one process, or a process group of
    ranks (the Ray backend starts rank actors: `distributed.ray_ranks`)."""
    return LearnerRanks if cfg.learner.parallel != "none" else LearnerWorker
