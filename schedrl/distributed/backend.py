"""Where the pipeline's workers run: Ray actors (`RayBackend`), threads of the calling process
(`ThreadBackend`), or the calling process, one call at a time (`LocalBackend`).

All three give the pipeline the same four verbs -- start a worker, `call` a method (a
future comes back), `wait` for some futures, `get` a result -- so the loop in
`schedrl.orchestrate.pipeline` never imports Ray. A worker that dies surfaces as
`WorkerDiedError` from `get`. `wait_built` waits for workers to finish building: loading a
model is not a call, so it is not held to `pipeline.worker_timeout_s`.

Placement: each actor gets `num_cpus` Ray CPUs, pins itself to its own cores and
sets torch's thread count to match; on 2 cores the engine runs on core 0 and the
learner on core 1. With more workers than cores (two engines and a learner on 2
cores) nobody is pinned and the OS shares the cores. Weights returned by the learner stay in the
Ray object store and go to the engine by reference. `ThreadBackend` places its worker threads
the same way and passes weights as plain objects.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec

from schedrl.config import RunConfig
from schedrl.contracts.workers import Backend
from schedrl.distributed.errors import InputLostError, WorkerDiedError, WorkerStuckError
from schedrl.distributed.workers import EngineWorker, LearnerWorker, RewardWorker
from schedrl.registry import Registry

P = ParamSpec("P")
STACK_TIMEOUT_S = 10.0  # how long a stuck Ray actor's stack may take to arrive

log = logging.getLogger(__name__)


def placement(
    num_engines: int, engine_cpus: int, learner_cpus: int
) -> tuple[list[list[int] | None], list[int] | None]:
    """Cores of each engine and of the learner, from the cores this process may use.

    Disjoint lists, engines first, when there are enough cores; otherwise nobody is pinned
    and the OS shares the cores among the workers (for example two 1-core engines and a
    1-core learner on 2 cores)."""
    cores = (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(os.cpu_count() or 1))
    )
    if num_engines * engine_cpus + learner_cpus > len(cores):
        return [None] * num_engines, None
    engines: list[list[int] | None] = [
        cores[i * engine_cpus : (i + 1) * engine_cpus] for i in range(num_engines)
    ]
    start = num_engines * engine_cpus
    return engines, cores[start : start + learner_cpus]


def stuck_message(waiting: list, backend: Any, timeout_s: float) -> str:
    """Who has not answered for `timeout_s`, and the stack of each."""
    names = ", ".join(name for name, _ in waiting) or "none"
    report = "\n".join(f"--- {name} ---\n{backend.stack(w)}" for name, w in waiting)
    return (
        f"stuck: no answer from {names} for {timeout_s:g} s (pipeline.worker_timeout_s); where each one is:\n"
        f"{report}\nunless it can be replaced (an engine on Ray is), the run stops; `schedrl train --resume` "
        "continues from its last checkpoint"
    )


def wait_built(backend: Any, named: list[tuple[str, Any]], report_s: float | None) -> None:
    """Return once every worker in `named` (name, worker) is built; a constructor's error is raised here.

    Building (starting a process, loading a model) has no deadline: a large model loads for
    minutes and a replacement engine must not be called stuck while it does. Every `report_s`
    seconds the workers still building are logged, with their stacks where they can be read."""
    pending, waited = list(named), 0.0
    while pending:
        built = backend.built([w for _, w in pending], timeout=report_s)
        pending = [(name, w) for name, w in pending if not any(w is b for b in built)]
        if pending and report_s:
            waited += report_s
            report = "\n".join(f"--- {name} ---\n{backend.stack(w)}" for name, w in pending)
            names = ", ".join(name for name, _ in pending)
            log.warning("still building after %g s: %s; where each one is:\n%s", waited, names, report)


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
    timeout_s: float | None = None  # every call has answered by the time it returns: nothing can be stuck

    @classmethod
    def create(cls, **placement: Any) -> LocalBackend:
        """One process, one call at a time: the placement does not apply."""
        return cls()

    def start_engine(
        self, cfg: RunConfig, weights: Any, version: int, index: int = 0, reward_source: Any = None
    ) -> EngineWorker:
        name = worker_name(index, cfg.pipeline.num_engines)
        return EngineWorker(cfg, self._resolve(weights), version, name=name, reward_source=reward_source)

    def start_reward(self, cfg: RunConfig, source: Any) -> RewardWorker:
        return RewardWorker(source)

    def start_learner(self, cfg: RunConfig, run_root: str, checkpoint: str | None) -> LearnerWorker:
        from schedrl.distributed.learner_ranks import learner_class

        return learner_class(cfg)(cfg, run_root, checkpoint)

    def _resolve(self, x: Any) -> Any:
        if isinstance(x, _Done):
            return self.get(x)
        return x

    def call(self, worker: Any, method: str, *args, num_returns: int = 1):
        try:
            value = getattr(worker, method)(*(self._resolve(a) for a in args))
        except WorkerDiedError:
            raise
        except Exception as e:  # surfaced by get(), as Ray does
            return _Done(error=e) if num_returns == 1 else tuple(_Done(error=e) for _ in range(num_returns))
        return _Done(value) if num_returns == 1 else tuple(_Done(v) for v in value)

    def wait(self, futures: list, timeout: float | None = None) -> list:
        return list(futures)

    def get(self, future: _Done, timeout: float | None = None):
        if future.error is not None:
            raise future.error
        return future.value

    def put(self, value: Any) -> _Done:
        return _Done(value)

    def built(self, workers: list, timeout: float | None = None) -> list:
        return list(workers)  # built when started

    def kill(self, worker: Any) -> None:
        pass

    def stack(self, worker: Any) -> str:
        return ""  # every call has returned before the next: nothing here can be stuck

    def shutdown(self, wait: bool = True) -> None:
        pass


@dataclass(eq=False)
class _Ref:
    """One result of a call on a `ThreadBackend` worker: part `index` of the call's future, or all of it."""

    future: Future
    index: int | None = None
    worker: Any = None

    def result(self):
        value = self.future.result()
        return value if self.index is None else value[self.index]


class _ThreadWorker:
    """A worker object living on its own thread: its calls run there one at a time, in order, as an actor's."""

    # transformers loads a model under process-wide patches (weights first made on the meta device), so
    # two loads at once on two threads break each other: workers are built one at a time
    building = threading.Lock()

    def __init__(self, name: str, cls, *args) -> None:
        self.name = name
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"schedrl-{name}")
        self.instance = self.pool.submit(self._build, cls, *args)  # on its thread, so `pin` pins that thread

    def _build(self, cls, *args):
        self.thread_id = threading.get_ident()  # for the stack of a stuck call
        with self.building:
            return cls(*args)


class ThreadBackend:
    """Workers on threads of this process, one per worker: the engine generates while the learner trains,
    with no processes to start and no weights to serialize.

    torch runs its kernels without Python's lock, so a learner's forward and backward overlap an
    engine's decode steps; the Python between kernels still takes turns. Each worker thread is
    pinned to its own cores where there are enough (Linux pins the calling thread), and torch uses
    one thread per kernel while the backend runs, so the two workers do not oversubscribe the cores.
    """

    name = "threads"

    @classmethod
    def create(
        cls, num_engines: int = 1, engine_cpus: int = 1, learner_cpus: int = 1, **placement: Any
    ) -> ThreadBackend:
        """The worker counts and their cores; a cluster address does not apply."""
        return cls(num_engines, engine_cpus, learner_cpus)

    def __init__(self, num_engines: int = 1, engine_cpus: int = 1, learner_cpus: int = 1) -> None:
        import torch

        self.num_engines = num_engines
        self.engine_cores, self.learner_cores = placement(num_engines, engine_cpus, learner_cpus)
        # torch's thread count is one setting for the whole process: one thread per kernel, since every
        # worker thread runs its own kernels (restored at shutdown)
        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self.workers: list[_ThreadWorker] = []
        self.timeout_s: float | None = None  # how long `get` waits for a call before calling it stuck

    def start_worker(self, name: str, cls, *args) -> _ThreadWorker:
        """`cls(*args)` built on a new thread of its own, where its calls will run."""
        worker = _ThreadWorker(name, cls, *args)
        self.workers.append(worker)
        return worker

    def start_engine(
        self, cfg: RunConfig, weights: Any, version: int, index: int = 0, reward_source: Any = None
    ) -> _ThreadWorker:
        name = worker_name(index, self.num_engines)
        cores = self.engine_cores[index]
        args = (cfg, self._resolve(weights), version, cores, 1, name, reward_source)
        return self.start_worker(name, EngineWorker, *args)

    def start_reward(self, cfg: RunConfig, source: Any) -> _ThreadWorker:
        """The reward worker's thread, on no cores of its own: it shares them with the others."""
        return self.start_worker("reward", RewardWorker, source, None, 1)

    def start_learner(self, cfg: RunConfig, run_root: str, checkpoint: str | None) -> _ThreadWorker:
        from schedrl.distributed.learner_ranks import learner_class

        cls = learner_class(cfg)
        return self.start_worker("learner", cls, cfg, run_root, checkpoint, self.learner_cores, 1)

    @staticmethod
    def _resolve(x: Any) -> Any:
        return x.result() if isinstance(x, _Ref) else x

    def call(self, worker: _ThreadWorker, method: str, *args, num_returns: int = 1):
        def run():
            # Arguments that are results of other calls are awaited here, on the worker's thread, as Ray does.
            return getattr(worker.instance.result(), method)(*(self._resolve(a) for a in args))

        future = worker.pool.submit(run)
        if num_returns == 1:
            return _Ref(future, None, worker)
        return tuple(_Ref(future, i, worker) for i in range(num_returns))

    def wait(self, futures: list, timeout: float | None = None) -> list:
        done, _ = wait_futures({r.future for r in futures}, timeout=timeout, return_when=FIRST_COMPLETED)
        return [r for r in futures if r.future in done]

    def get(self, ref: _Ref, timeout: float | None = None):
        """The call's result; `WorkerStuckError`, with the worker's stack, when it has not answered within
        `timeout` seconds (default: `timeout_s`, the pipeline's `worker_timeout_s`)."""
        limit = timeout if timeout is not None else self.timeout_s
        try:
            value = ref.future.result(limit)
        except TimeoutError:
            who = [(ref.worker.name, ref.worker)] if ref.worker is not None else []
            raise WorkerStuckError(stuck_message(who, self, limit or 0)) from None
        return value if ref.index is None else value[ref.index]

    def put(self, value: Any) -> _Ref:
        future: Future = Future()
        future.set_result(value)
        return _Ref(future)

    def built(self, workers: list[_ThreadWorker], timeout: float | None = None) -> list[_ThreadWorker]:
        """The workers whose object is built within `timeout` seconds; a constructor's error is raised."""
        wait_futures([w.instance for w in workers], timeout=timeout)
        done = [w for w in workers if w.instance.done()]
        for w in done:
            w.instance.result()
        return done

    def kill(self, worker: _ThreadWorker) -> None:
        worker.pool.shutdown(wait=False, cancel_futures=True)  # a thread cannot be stopped mid-call

    def stack(self, worker: _ThreadWorker) -> str:
        """Where the worker's thread is now."""
        frame = sys._current_frames().get(getattr(worker, "thread_id", -1))
        return "".join(traceback.format_stack(frame)) if frame is not None else "(its thread has ended)"

    def shutdown(self, wait: bool = True) -> None:
        """Stop the workers; `wait=False` leaves a stuck thread behind rather than wait for it forever."""
        import torch

        for worker in self.workers:
            worker.pool.shutdown(wait=wait, cancel_futures=True)
        self.workers = []
        torch.set_num_threads(self._threads)


class RayBackend:
    """Workers as Ray actors on a local cluster started here, or on an existing one by address."""

    name = "ray"

    @classmethod
    def create(
        cls,
        address: str | None = None,
        num_engines: int = 1,
        engine_cpus: int = 1,
        learner_cpus: int = 1,
        **placement: Any,
    ) -> RayBackend:
        ranks = int(placement.get("learner_ranks", 1))
        return cls(
            address,
            num_engines=num_engines,
            engine_cpus=engine_cpus,
            learner_cpus=learner_cpus,
            learner_ranks=ranks,
            reward_cpus=float(placement.get("reward_cpus", 0.0)),
        )

    def __init__(
        self,
        address: str | None = None,
        num_cpus: int | None = None,
        object_store_memory: int = 200 * 2**20,
        num_engines: int = 1,
        engine_cpus: int = 1,
        learner_cpus: int = 1,
        learner_ranks: int = 1,
        reward_cpus: float = 0.0,
    ) -> None:
        """`learner_ranks`: the learner's ranks, `learner_cpus` each; `reward_cpus`: a separate reward
        worker's (a local cluster gets all their CPUs)."""
        try:  # an optional extra: imported only when a Ray backend is asked for
            import ray
            import ray.exceptions
        except ImportError:
            raise ImportError(
                "pipeline.backend 'ray' needs Ray: pip install 'schedrl[ray]' (or use backend 'threads')"
            ) from None

        self.timeout_s: float | None = None  # how long `get` waits for a call before calling it stuck
        self.ray, self.errors = ray, ray.exceptions
        self.actors: dict[str, tuple[str, Any]] = {}  # actor id -> (its name, its handle)
        self._started = False
        asked = num_engines * engine_cpus + learner_cpus * learner_ranks + reward_cpus
        if not ray.is_initialized():
            if address is None:
                os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local cluster on loopback
                ray.init(
                    num_cpus=num_cpus or math.ceil(asked),
                    object_store_memory=object_store_memory,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                )
            else:
                ray.init(address=address, log_to_driver=False)
            self._started = True
        # On a cluster with fewer CPUs than asked, every actor asks for its share, so all of them start.
        share = min(1.0, ray.cluster_resources().get("CPU", asked) / asked)
        self.engine_cpus, self.learner_cpus = engine_cpus, learner_cpus
        self.engine_ask, self.learner_ask, self.reward_ask = (
            math.floor(n * share * 1e4) / 1e4 for n in (engine_cpus, learner_cpus, reward_cpus)
        )
        self.num_engines = num_engines
        self.engine_cores, self.learner_cores = (
            placement(num_engines, engine_cpus, learner_cpus)
            if address is None
            else ([None] * num_engines, None)
        )

    def _actor(self, cls, cpus: float, node: str | None = None):
        """An actor class of `cpus` CPUs, on a node labelled `schedrl-node=<node>` if `node` is given.
        Calls run one at a time on the default group; `stacks` has a thread of its own, so a stuck call
        can be located while it runs."""
        from schedrl.distributed.ray_ranks import NODE_LABEL

        options: dict[str, Any] = {"num_cpus": cpus, "max_restarts": 0, "concurrency_groups": {"watchdog": 1}}
        if node:
            options["label_selector"] = {NODE_LABEL: node}
        return self.ray.remote(**options)(cls)

    def start_engine(
        self, cfg: RunConfig, weights: Any, version: int, index: int = 0, reward_source: Any = None
    ):
        actor = self._actor(EngineWorker, self.engine_ask, cfg.pipeline.engine_node)
        name = worker_name(index, self.num_engines)
        cores = self.engine_cores[index]
        handle = actor.remote(cfg, weights, version, cores, self.engine_cpus, name, reward_source)
        return self._named(name, handle)

    def start_reward(self, cfg: RunConfig, source: Any):
        """The reward worker as an actor of `pipeline.reward_cpus` CPUs (on the engines' node, if named),
        unpinned: its task (and reward model) is pickled to it."""
        p = cfg.pipeline
        actor = self._actor(RewardWorker, self.reward_ask, p.engine_node)
        return self._named("reward", actor.remote(source, None, max(1, math.ceil(p.reward_cpus))))

    def start_learner(self, cfg: RunConfig, run_root: str, checkpoint: str | None):
        """The learner actor; with `learner.ranks` > 1 its ranks are actors of their own, in a placement
        group (`distributed.ray_ranks`), and the actor that calls them holds no CPU."""
        from schedrl.distributed.ray_ranks import RayLearnerRanks

        if cfg.learner.parallel != "none":
            actor = self._actor(RayLearnerRanks, 0, cfg.pipeline.learner_node)
        else:
            actor = self._actor(LearnerWorker, self.learner_ask, cfg.pipeline.learner_node)
        handle = actor.remote(cfg, run_root, checkpoint, self.learner_cores, self.learner_cpus)
        return self._named("learner", handle)

    def _named(self, name: str, handle: Any) -> Any:
        self.actors[handle._actor_id.hex()] = (name, handle)  # a stuck call's ref names its actor
        return handle

    def call(self, worker: Any, method: str, *args, num_returns: int = 1):
        fn = getattr(worker, method)
        if num_returns != 1:
            fn = fn.options(num_returns=num_returns)
        return fn.remote(*args)

    def wait(self, futures: list, timeout: float | None = None) -> list:
        ready, _ = self.ray.wait(list(futures), num_returns=1, timeout=timeout)
        return ready

    def get(self, future: Any, timeout: float | None = None) -> Any:
        limit = timeout if timeout is not None else self.timeout_s
        try:
            return self.ray.get(future, timeout=limit)
        except (self.errors.RayActorError, self.errors.ActorUnavailableError) as e:
            actor = self.actors.get(future.task_id().actor_id().hex(), ("a Ray actor", None))[0]
            raise WorkerDiedError(f"{actor} died: {str(e).splitlines()[0]}") from e
        except self.errors.ObjectLostError as e:  # raised as the call's error: its input is gone
            actor = self.actors.get(future.task_id().actor_id().hex(), ("a Ray actor", None))[0]
            raise InputLostError(
                f"an input of a call to {actor} was lost with the worker or node that held it (the learner's "
                f"weights, when its node died): {str(e).splitlines()[-1]}"
            ) from e
        except self.errors.GetTimeoutError as e:
            actor = self.actors.get(future.task_id().actor_id().hex(), ("a Ray actor", None))
            raise WorkerStuckError(stuck_message([actor], self, limit or 0)) from e

    def put(self, value: Any):
        return self.ray.put(value)

    def built(self, workers: list, timeout: float | None = None) -> list:
        """The actors whose constructor has returned within `timeout` seconds; one that raised (or whose
        process died) raises `WorkerDiedError`."""
        refs = {worker.__ray_ready__.remote(): worker for worker in workers}
        ready, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        for ref in ready:
            try:
                self.ray.get(ref)
            except (self.errors.RayActorError, self.errors.ActorUnavailableError) as e:
                name = self.actors.get(refs[ref]._actor_id.hex(), ("a Ray actor",))[0]
                raise WorkerDiedError(f"{name} failed to start: {e}") from e
        return [refs[ref] for ref in ready]

    def kill(self, worker: Any) -> None:
        self.ray.kill(worker)

    def stack(self, worker: Any) -> str:
        """Where the actor's current call is, asked on its `watchdog` thread."""
        if worker is None:
            return "(unknown actor)"
        try:
            ref = worker.stacks.options(concurrency_group="watchdog").remote()
            return self.ray.get(ref, timeout=STACK_TIMEOUT_S)
        except Exception as err:  # a dead or unreachable actor: say so, the message still goes out
            return f"(its stack could not be read: {type(err).__name__}: {str(err).splitlines()[0]})"

    def shutdown(self, wait: bool = True) -> None:
        """Stop the cluster if this backend started it; on a cluster it found running (by address, or one
        already initialised in this process) stop only this run's actors and leave the cluster up."""
        if self._started:
            self.ray.shutdown()
            self._started = False
        else:
            for _, handle in self.actors.values():
                with contextlib.suppress(Exception):  # an actor already dead (killed, or its node gone)
                    self.ray.kill(handle)
        self.actors = {}


def remote(
    backend: Backend, worker: Any, method: Callable[Concatenate[Any, P], Any], returns: int = 1
) -> Callable[P, Any]:
    """A typed call of `worker.method` on `backend`: `remote(b, learner, LearnerWorker.update, 2)(batch,
    step)` checks the arguments against the method's signature and returns the call's future(s). The
    call goes by the method's `__name__` (a wrapper of a worker method keeps it: `functools.wraps`)."""

    def send(*args: P.args, **kwargs: P.kwargs) -> Any:
        if kwargs:
            raise TypeError(f"{method.__name__}: calls across a worker seam take positional arguments only")
        return backend.call(worker, method.__name__, *args, num_returns=returns)

    return send


WORKER_BACKENDS: Registry[Any] = Registry("worker backend")
WORKER_BACKENDS.add("local", LocalBackend)
WORKER_BACKENDS.add("threads", ThreadBackend)
WORKER_BACKENDS.add("ray", RayBackend)


def make_backend(name: str, **placement: Any) -> Backend:
    """The worker backend `name` (`WORKER_BACKENDS`, or `pkg.module:Class`) built by its `create` from the
    placement keywords (address, num_engines, engine_cpus, learner_cpus, learner_ranks, reward_cpus), each
    taking what it uses."""
    return WORKER_BACKENDS.get(name).create(**placement)
