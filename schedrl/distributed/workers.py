"""The two workers of the asynchronous pipeline, as plain classes.

`schedrl.distributed.backend` runs them as Ray actors (each on its own cores) or in
the calling process; they never import Ray themselves. Both build their model from the
run config, so only weights cross process boundaries.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from schedrl.config import RunConfig
from schedrl.contracts.workers import LearnerBatch
from schedrl.engine.migration import migrants
from schedrl.engine.weight_push import WeightPush, bucketed, make_probe, receive
from schedrl.timeline import Recorder, Span
from schedrl.training.batch import collate
from schedrl.training.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    set_rng_state,
    temporary_dir,
)
from schedrl.training.learner import OPTIMIZER_DIR
from schedrl.training.lora import ADAPTER_DIR, adapter_weights, lora_spec, merged_state_dict, save_adapter
from schedrl.training.parallel import full_state_dict, tied_names
from schedrl.types import Request, Sample


def pin(cores: Sequence[int] | None, threads: int | None) -> None:
    """Give this process `cores` (where the OS allows it) and `threads` torch threads."""
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cores))
    if threads:
        torch.set_num_threads(threads)


def busy_stacks() -> str:
    """Where this process's threads are, but the caller's: on a Ray actor only the thread that runs its
    current call (from the frame after Ray's method executor), elsewhere every other thread."""
    me = threading.get_ident()
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        frames = traceback.extract_stack(frame)
        starts = [i for i, f in enumerate(frames) if f.name == "actor_method_executor"]
        if starts:
            frames = frames[starts[-1] + 1 :]
        out.append(
            (bool(starts), f"thread {names.get(ident, ident)!r}:\n" + "".join(traceback.format_list(frames)))
        )
    calls = [text for in_call, text in out if in_call]
    return "\n".join(calls or [text for _, text in out]) or "(no other thread)"


class Inspectable:
    """`stacks()`: answered off the worker's call thread (Ray runs it in the `watchdog` concurrency
    group), so a call that never returns can still be located."""

    def stacks(self) -> str:
        return busy_stacks()


def cpu_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def gathered(tensor: torch.Tensor, keep: bool) -> torch.Tensor:
    """`tensor` whole on the CPU (a sharded one gathered from every rank: a collective); an empty tensor
    where not `keep`."""
    full = getattr(tensor, "full_tensor", None)
    whole = full() if full is not None else tensor.detach()
    return whole.to("cpu", copy=True) if keep else torch.empty(0)


MAX_TASKS_KEPT = 4096  # tasks a colocated scorer keeps for the samples it may still score


class EngineWorker(Inspectable):
    """An `HFEngine` stepped in chunks; takes new weights between chunks (between decode steps)."""

    def __init__(
        self,
        cfg: RunConfig,
        weights: dict[str, torch.Tensor],
        version: int,
        cores=None,
        threads=None,
        name: str = "engine",
        reward_source: Any = None,
    ):
        """`reward_source` (`pipeline.reward_placement: colocated`): the task whose reward this worker
        computes for its finished samples, between engine steps, on its own cores and device."""
        # imported here, to keep this module light to import
        from schedrl.orchestrate.build import load_policy, make_engine

        pin(cores, threads)
        self.cfg = cfg  # resolved once, by the driver; a Ray actor gets a pickled copy
        model, self.tokenizer = load_policy(self.cfg, self.cfg.model.path, torch.device("cpu"))
        model.load_state_dict(weights)
        self.engine = make_engine(self.cfg, model, self.tokenizer, version=version)
        self._base = self.engine  # the engine itself, below any episode wrapper (what `close` shuts down)
        if self.cfg.task.env != "single_turn":  # multi-turn: the worker runs episodes on its engine
            from schedrl.envs import make_task
            from schedrl.orchestrate.build import make_episodes
            from schedrl.rollout.episode_engine import EpisodeEngine

            source = make_task(self.cfg.task.name, **self.cfg.task.args)
            runner = make_episodes(self.cfg, self.engine, self.tokenizer, source)
            assert runner is not None
            self.engine: Any = EpisodeEngine(runner)
        self.timeline = Recorder(name)
        if self.cfg.task.env != "single_turn" and self.cfg.logging.episode_trace:
            runner.timeline = self.timeline  # each episode's turns and calls, spans of this worker
        self.scorer = None
        if reward_source is not None:
            from schedrl.envs.scoring import RewardScorer
            from schedrl.rewards.judge import policy_judges

            self.scorer = RewardScorer(reward_source, max_error_rate=1.0)  # the driver counts and judges
            for judge in policy_judges(reward_source):  # `judge: policy`: the engine's own model judges
                judge.bind_policy(self._base)
        self.tasks: dict = {}  # id -> Task of the requests queued here, for the colocated scorer

    def add(self, requests: Sequence[Request], tasks: dict | None = None) -> None:
        """Queue `requests`; `tasks` (id -> Task) are the tasks of multi-turn episodes among them."""
        set_tasks = getattr(self.engine, "set_tasks", None)
        if tasks is not None and set_tasks is not None:
            set_tasks(tasks)
        if tasks is not None and self.scorer is not None:
            self.tasks.update(tasks)
            if len(self.tasks) > MAX_TASKS_KEPT:  # the oldest go; a sample of one is scored by the driver
                self.tasks = dict(list(self.tasks.items())[len(self.tasks) // 2 :])
        for r in requests:
            self.engine.add(r)

    def run(self, max_steps: int) -> list[Sample]:
        """Up to `max_steps` engine steps; returns the samples that finished."""
        finished: list[Sample] = []
        for _ in range(max_steps):
            if not self.engine.has_unfinished():
                break
            waiting = self.engine.num_waiting
            start = time.time()
            done = self.engine.step()
            kind = "prefill" if self.engine.num_waiting < waiting else "decode"
            self.timeline.add(kind, start, time.time())
            finished += self._score(done) if self.scorer is not None and done else done
        return finished

    def _score(self, samples: list[Sample]) -> list[Sample]:
        """Colocated rewards: the finished samples scored here, before the next engine step; a cut sample,
        an episode's (scored by its environment) or one whose task is unknown here goes back unscored, for
        the driver to score."""
        assert self.scorer is not None
        start = time.time()
        out = self.scorer.score_where(self.tasks, samples)
        self.timeline.add("reward", start, time.time())
        return out

    def abort(self, request_ids: Sequence[str]) -> list[Sample]:
        """Abandon these requests where they are still waiting or running (tail batching's spares and
        dropped groups); returns their partial samples. An episode is discarded, not suspended: nothing
        of it would ever resume it."""
        discard = getattr(self.engine, "discard", None)
        if discard is not None:
            return [s for s in map(discard, request_ids) if s is not None]
        held = set(self.engine.waiting_ids + self.engine.running_ids)
        return [self.engine.abort(i) for i in request_ids if i in held]

    def hand_over(self, n: int) -> list[Sample]:
        """Cut up to `n` requests for another engine (long-tail migration, `engine.migration`); returns
        their partial samples, to resume from their prefixes there. An engine that does not list its
        running requests hands over waiting ones only."""
        running = getattr(self.engine, "running_requests", list)()
        ids = migrants(self.engine.waiting_ids, running, n)
        return [self.engine.abort(i) for i in ids]

    def abort_all(self) -> list[Sample]:
        """Cut every waiting and running request; returns their partial samples (prefix kept)."""
        ids = self.engine.waiting_ids + self.engine.running_ids
        return [self.engine.abort(i) for i in ids]

    def update_weights(self, weights: WeightPush | dict[str, torch.Tensor], version: int) -> int:
        """Load `weights` as policy `version`. A `WeightPush` is taken bucket by bucket and checked
        (`engine.weight_push.receive`): a bucket the engine does not hold as sent, or a probe it does
        not reproduce, raises, naming the version and the bucket."""
        with self.timeline.span("weight-sync"):
            if isinstance(weights, WeightPush):
                receive(self._base, weights, version, self.timeline.worker, self.cfg.pipeline.verify_pushes)
            else:
                self.engine.update_weights(weights, version)
        return version

    def spans(self) -> list[Span]:
        return self.timeline.drain()

    def counters(self) -> dict[str, float]:
        """A multi-turn worker's cumulative episode counts (`EpisodeRunner.counters`); {} otherwise."""
        runner = getattr(self.engine, "runner", None)
        return runner.counters() if runner is not None else {}

    def close(self) -> None:
        """Shut the engine down where it has resources of its own (vLLM's); a no-op for the built-in one."""
        close = getattr(self._base, "close", None)
        if close is not None:
            close()


class RewardWorker(Inspectable):
    """`pipeline.reward_placement: separate`: a worker of its own that scores finished samples (its reward
    model on its own cores and device) while the engines go on decoding."""

    def __init__(self, source: Any, cores=None, threads=None) -> None:
        from schedrl.envs.scoring import RewardScorer

        pin(cores, threads)
        self.scorer = RewardScorer(source, max_error_rate=1.0)  # the driver counts and judges
        self.timeline = Recorder("reward")

    def score(self, tasks: dict, samples: list[Sample]) -> list[Sample]:
        """`samples` with their rewards, errors and the scoring call's metrics (`RewardScorer.score`)."""
        with self.timeline.span("reward"):
            return self.scorer.score(tasks, samples)

    def spans(self) -> list[Span]:
        return self.timeline.drain()


def train_step(learner: Any, pad_id: int, batch: LearnerBatch, step: int) -> dict[str, float]:
    """One optimizer step of `learner` on `batch`; the weights being updated are version `step` (update s
    turns version s into s + 1)."""
    tokens = collate(
        batch.prompt_ids, batch.token_ids, pad_id, batch.logprobs, batch.versions, batch.train_mask
    )
    return learner.update(tokens, torch.tensor(batch.advantages), step, version=step)


class LearnerWorker(Inspectable):
    """The policy, its optimizer and the loss; trains on scored samples and hands back weights."""

    def __init__(
        self, cfg: RunConfig, run_root: str, checkpoint: str | None, cores=None, threads=None, ranks=None
    ):
        """`ranks` (`training.parallel.Ranks`): this worker is one rank of a learner process group, which
        it has joined (`distributed.learner_ranks` starts the ranks)."""
        from schedrl.models import default_device
        from schedrl.orchestrate.build import REF_MODEL_DIR, load_policy, make_learner

        pin(cores, threads)
        self.cfg, self.ranks = cfg, ranks
        self.root = Path(run_root)
        device = default_device()
        path = Path(checkpoint) / "model" if checkpoint else self.cfg.model.path
        adapter = Path(checkpoint) / ADAPTER_DIR if checkpoint else None
        if adapter is not None and adapter.is_dir():  # LoRA: the base RL started from, then the adapters
            path = self.root / REF_MODEL_DIR
        self.model, self.tokenizer = load_policy(self.cfg, path, device)
        ref = None
        if self.cfg.algo.kl_coef > 0:
            ref = load_policy(self.cfg, self.root / REF_MODEL_DIR, device)[0].eval().requires_grad_(False)
        resumed = adapter if adapter is not None and adapter.is_dir() else None
        self.learner = make_learner(self.cfg, self.model, ref, ranks, worker=True, adapter=resumed)
        if checkpoint:
            _, trainer_state, rng = load_checkpoint(Path(checkpoint))
            self.learner.load_state_dict(trainer_state, Path(checkpoint))
            set_rng_state(rng)
        self.timeline = Recorder("learner")

    def weights(self, version: int) -> WeightPush:
        """The policy as a push of `version` (`engine.weight_push`): its weights gathered on the CPU bucket
        by bucket (on a process group: on rank 0, one decoder layer at a time; other ranks' pushes are
        empty), or with LoRA the adapters only; with `pipeline.verify_pushes`, the probe the engines
        must reproduce."""
        model = self.learner.model
        if self.cfg.learner.lora is not None:
            push = WeightPush(version, adapters=adapter_weights(model))
        else:
            inner = getattr(model, "module", model)  # DDP's wrapper holds the model
            tied = tied_names(inner)
            keep = self.ranks is None or self.ranks.rank == 0
            buckets = bucketed(
                (
                    (name, partial(gathered, tensor, keep))
                    for name, tensor in inner.state_dict().items()
                    if name not in tied
                ),
                self.cfg.pipeline.verify_pushes,
            )
            push = WeightPush(version, buckets if keep else [], [b.name for b in buckets])
        if self.cfg.pipeline.verify_pushes:
            from schedrl.orchestrate.build import probe_tol

            inner = getattr(model, "module", model)  # every rank runs it: FSDP2 gathers in each forward
            push.probe = make_probe(len(self.tokenizer), inner, probe_tol(self.cfg))
        return push

    def update(self, batch: LearnerBatch, step: int) -> tuple[dict[str, float], WeightPush]:
        """One optimizer step on `batch` (`schedrl.orchestrate.update_batch.UpdateBatch.learner_batch`);
        returns its statistics and the push of the new weights (version `step + 1`)."""
        start = time.perf_counter()
        with self.timeline.span("train"):
            stats = train_step(self.learner, self.tokenizer.pad_token_id, batch, step)
        with self.timeline.span("weight-sync"):
            weights = self.weights(step + 1)
        stats["learner_peak_mb"] = self.peak_mb()
        return {**stats, "train_s": time.perf_counter() - start}, weights

    def peak_mb(self) -> float:
        """The learner's peak memory so far, in MB: the device's allocations on a GPU, else the process's
        peak resident set; on a process group, the largest rank's."""
        if torch.cuda.is_available():
            peak = torch.cuda.max_memory_allocated() / 2**20
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if self.ranks is not None:
            t = torch.tensor([peak], dtype=torch.float64)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            peak = float(t.item())
        return peak

    def save_checkpoint(self, step: int, state: dict) -> str:
        """Write checkpoint `step`. On a process group rank 0 writes it (the model gathered whole, as one
        process saves it) and every rank writes its shard of AdamW's state into it (torch.distributed.
        checkpoint), inside the checkpoint's temporary directory, before it is renamed complete."""
        ckpt_dir = self.root / "checkpoints"
        final = ckpt_dir / f"step_{step:06d}"
        current = latest_checkpoint(ckpt_dir)
        if current is not None and current.name == final.name:  # a resume saving its own start again
            return str(final)
        weights: dict[str, torch.Tensor] | None = None
        extras: list[Callable[[Path], None]] = []
        if self.cfg.learner.lora is not None:  # the merged policy (for evaluation), and the adapters
            adapters = adapter_weights(self.learner.model)  # on a process group: gathered, every rank
            weights = merged_state_dict(self.learner.model)
            targets = lora_spec(self.cfg.learner.lora)["target_modules"]
            extras.append(lambda tmp: save_adapter(adapters, tmp / ADAPTER_DIR, targets))
        elif self.ranks is not None:
            weights = full_state_dict(self.learner.model)
        if weights is not None:  # a tied weight gathered is a copy of its own: saved once, as on one process
            tied = tied_names(self.model)
            weights = {k: v for k, v in weights.items() if k not in tied}
        trainer_state = self.learner.state_dict()
        path = final
        if self.ranks is not None:
            sharded = self.learner.save_sharded_optimizer  # a collective: every rank, the same directory
            if self.ranks.rank != 0:  # rank 0 calls it inside the checkpoint protocol, on the same path
                sharded(temporary_dir(ckpt_dir, step) / OPTIMIZER_DIR)
            extras.append(lambda tmp: sharded(tmp / OPTIMIZER_DIR))

        def extra(tmp: Path) -> None:
            for write in extras:
                write(tmp)

        if self.ranks is None or self.ranks.rank == 0:
            path = save_checkpoint(
                ckpt_dir,
                step,
                self.model,
                self.tokenizer,
                trainer_state,
                state,
                keep_last=self.cfg.keep_last,
                weights=weights,
                extra=extra if extras else None,
            )
        if self.ranks is not None:
            torch.distributed.barrier()  # no rank goes on before the checkpoint is complete
        return str(path)

    def spans(self) -> list[Span]:
        return self.timeline.drain()

    def close(self) -> None:
        """Nothing to release (a `LearnerRanks` stops its rank processes here)."""
