"""Where the pipeline's workers run: Ray actors (`RayBackend`) or the calling process (`LocalBackend`).

Both give the pipeline the same four verbs -- start a worker, `call` a method (a
future comes back), `wait` for some futures, `get` a result -- so the loop in
`schedrl.orchestrate.pipeline` never imports Ray. A worker that dies surfaces as
`WorkerDiedError` from `get`.

Placement: each actor gets `num_cpus` Ray CPUs, pins itself to its own cores and
sets torch's thread count to match; on 2 cores the engine runs on core 0 and the
learner on core 1. With more workers than cores (two engines and a learner on 2
cores) nobody is pinned and the OS shares the cores. Weights returned by the learner stay in the Ray object store and
go to the engine by reference.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from schedrl.distributed.workers import EngineWorker, LearnerWorker


class WorkerDiedError(RuntimeError):
    """A worker process died (killed, out of memory, crashed)."""


def placement(num_engines: int, engine_cpus: int, learner_cpus: int) -> tuple[list[list[int] | None], list[int] | None]:
    """Cores of each engine and of the learner, from the cores this process may use.

    Disjoint lists, engines first, when there are enough cores; otherwise nobody is pinned
    and the OS shares the cores among the workers (for example two 1-core engines and a
    1-core learner on 2 cores)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if num_engines * engine_cpus + learner_cpus > len(cores):
        return [None] * num_engines, None
    engines = [cores[i * engine_cpus : (i + 1) * engine_cpus] for i in range(num_engines)]
    start = num_engines * engine_cpus
    return engines, cores[start : start + learner_cpus]


def worker_name(index: int, num_engines: int) -> str:
    """The timeline name of engine `index`: "engine" when it is the only one, else "engine-<index>"."""
    return "engine" if num_engines == 1 else f"engine-{index}"


@dataclass
class _Done:
    value: Any = None
    error: BaseException | None = None


class LocalBackend:
    """Runs every call at once in this process: a deterministic, serial pipeline (tests, debugging)."""

    name = "local"

    def start_engine(self, cfg: dict, weights, version: int, index: int = 0) -> EngineWorker:
        name = worker_name(index, cfg["pipeline"]["num_engines"])
        return EngineWorker(cfg, self._resolve(weights), version, name=name)

    def start_learner(self, cfg: dict, run_root: str, checkpoint: str | None) -> LearnerWorker:
        return LearnerWorker(cfg, run_root, checkpoint)

    def _resolve(self, x):
        if isinstance(x, _Done):
            return self.get(x)
        return x

    def call(self, worker, method: str, *args, num_returns: int = 1):
        try:
            value = getattr(worker, method)(*(self._resolve(a) for a in args))
        except WorkerDiedError:
            raise
        except Exception as e:  # surfaced by get(), as Ray does
            return _Done(error=e) if num_returns == 1 else tuple(_Done(error=e) for _ in range(num_returns))
        return _Done(value) if num_returns == 1 else tuple(_Done(v) for v in value)

    def wait(self, futures: list, timeout: float | None = None) -> list:
        return list(futures)

    def get(self, future: _Done):
        if future.error is not None:
            raise future.error
        return future.value

    def put(self, value) -> _Done:
        return _Done(value)

    def kill(self, worker) -> None:
        pass

    def shutdown(self) -> None:
        pass


class RayBackend:
    """Workers as Ray actors on a local cluster started here, or on an existing one by address."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None,
                 object_store_memory: int = 200 * 2**20, num_engines: int = 1, engine_cpus: int = 1,
                 learner_cpus: int = 1) -> None:  # fmt: skip
        import ray

        self.ray = ray
        self._started = False
        asked = num_engines * engine_cpus + learner_cpus
        if not ray.is_initialized():
            if address is None:
                os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local cluster on loopback
                ray.init(num_cpus=num_cpus or asked, object_store_memory=object_store_memory,
                         include_dashboard=False, log_to_driver=False, configure_logging=False)  # fmt: skip
            else:
                ray.init(address=address, log_to_driver=False)
            self._started = True
        # On a cluster with fewer CPUs than asked, every actor asks for its share, so all of them start.
        share = min(1.0, ray.cluster_resources().get("CPU", asked) / asked)
        self.engine_cpus, self.learner_cpus = engine_cpus, learner_cpus
        self.engine_ask, self.learner_ask = (math.floor(n * share * 1e4) / 1e4 for n in (engine_cpus, learner_cpus))
        self.num_engines = num_engines
        self.engine_cores, self.learner_cores = (
            placement(num_engines, engine_cpus, learner_cpus) if address is None else ([None] * num_engines, None)
        )

    def start_engine(self, cfg: dict, weights, version: int, index: int = 0):
        actor = self.ray.remote(num_cpus=self.engine_ask, max_restarts=0)(EngineWorker)
        return actor.remote(cfg, weights, version, self.engine_cores[index], self.engine_cpus,
                            worker_name(index, self.num_engines))  # fmt: skip

    def start_learner(self, cfg: dict, run_root: str, checkpoint: str | None):
        actor = self.ray.remote(num_cpus=self.learner_ask, max_restarts=0)(LearnerWorker)
        return actor.remote(cfg, run_root, checkpoint, self.learner_cores, self.learner_cpus)

    def call(self, worker, method: str, *args, num_returns: int = 1):
        fn = getattr(worker, method)
        if num_returns != 1:
            fn = fn.options(num_returns=num_returns)
        return fn.remote(*args)

    def wait(self, futures: list, timeout: float | None = None) -> list:
        ready, _ = self.ray.wait(list(futures), num_returns=1, timeout=timeout)
        return ready

    def get(self, future):
        try:
            return self.ray.get(future)
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.ActorUnavailableError) as e:
            raise WorkerDiedError(str(e).splitlines()[0]) from e

    def put(self, value):
        return self.ray.put(value)

    def kill(self, worker) -> None:
        self.ray.kill(worker)

    def shutdown(self) -> None:
        if self._started:
            self.ray.shutdown()
            self._started = False


def make_backend(name: str, **kwargs):
    """`name` "ray" (keyword arguments as `RayBackend`) or "local" (they are ignored: one process)."""
    if name == "local":
        return LocalBackend()
    if name == "ray":
        return RayBackend(**kwargs)
    raise ValueError(f"pipeline.backend must be 'ray' or 'local', got {name!r}")
