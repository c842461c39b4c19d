"""How much slower a run's engine and learner work side by side on shared cores: a microbenchmark.

The `threads` backend runs the engine and the learner as two threads of one process, each pinned to
its own core with one torch thread; they still share the GIL, the memory bandwidth and the caches, so
each runs slower than alone. `measure_interference(run_dir)` measures that on this machine, with the
run's own model (its last checkpoint), engine and learner: the engine generates a step's requests over
and over, the learner trains on one step's samples over and over, each alone for `seconds`, then both
at once, in `rounds` interleaved rounds (the median: the slowdown varies from one window to the next).
The slowdown of each is its rate alone over its rate beside the other (tokens generated per second;
tokens trained per second). It stands in for `interference(sync_run, async_run)`, which needs an
asynchronous run to read the same two numbers from, and it holds only while both work: a scenario
calibrated with it applies it that way (`cluster.interference: overlap`).
"""

from __future__ import annotations

import copy
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from schedrl.config import load_config
from schedrl.distributed.backend import placement
from schedrl.distributed.workers import pin
from schedrl.orchestrate.build import load_policy, make_engine, make_learner
from schedrl.training.batch import collate
from schedrl.training.checkpoint import latest_checkpoint
from schedrl.types import Request, SamplingParams


def _rate(work: Callable[[], int], cores: list[int] | None, seconds: float, out: list[float], go) -> None:
    """Run `work` (it returns the tokens it did) until `seconds` have passed; tokens per second."""
    pin(cores, None)  # on Linux: this thread only
    go.wait()
    start, done = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        done += work()
    out.append(done / (time.perf_counter() - start))


def _side_by_side(works: list[Callable[[], int]], cores: list, seconds: float) -> list[float]:
    go = threading.Event()
    outs: list[list[float]] = [[] for _ in works]
    threads = [
        threading.Thread(target=_rate, args=(w, c, seconds, o, go), daemon=True)
        for w, c, o in zip(works, cores, outs, strict=True)
    ]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join()
    return [o[0] for o in outs]


def measure_interference(run_dir: str | Path, seconds: float = 2.0, rounds: int = 5) -> tuple[float, float]:
    """(engine, learner) slowdown of the run's workers side by side against each alone, on this machine:
    the median over `rounds` of `seconds` alone each and `seconds` together."""
    root = Path(run_dir)
    if not (root / "config.yaml").is_file():
        raise ValueError(
            f"run {str(root)!r} has no config.yaml: the microbenchmark needs a schedrl run directory"
        )
    cfg = load_config(root / "config.yaml", saved=True)  # a run saved before a key moved loads too
    ckpt = latest_checkpoint(root / "checkpoints")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the threads backend: one torch thread, each worker on its own core
    try:
        model, tokenizer = load_policy(cfg, ckpt / "model" if ckpt else cfg.model.path, torch.device("cpu"))
        engine = make_engine(cfg, copy.deepcopy(model), tokenizer)
        learner = make_learner(cfg, model)
        s = cfg.sampling
        params = SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature)
        g = torch.Generator().manual_seed(cfg.seed)
        prompt = tuple(torch.randint(4, len(tokenizer), (24,), generator=g).tolist())
        issued = [0]

        def requests() -> list[Request]:
            issued[0] += 1
            n = s.prompts_per_step * s.group_size
            return [
                Request(f"r{issued[0]}-{i}", prompt, params, group_id=f"g{i // s.group_size}")
                for i in range(n)
            ]

        samples = [x for x in engine.generate(requests()) if x.token_ids]
        batch = collate(
            [x.prompt_ids for x in samples], [x.token_ids for x in samples], tokenizer.pad_token_id
        )
        advantages = torch.randn(len(samples), generator=g)
        trained = sum(len(x.prompt_ids) + len(x.token_ids) for x in samples)

        def generate() -> int:
            return sum(len(x.token_ids) for x in engine.generate(requests()))

        def train() -> int:
            learner.update(batch, advantages, step=0)
            return trained

        engine_cores, learner_cores = placement(1, 1, 1)
        cores = [engine_cores[0], learner_cores]
        engine_f, learner_f = [], []
        for _ in range(rounds):  # interleaved, so that a drift of the machine's speed hits all three alike
            engine_alone = _side_by_side([generate], cores[:1], seconds)[0]
            learner_alone = _side_by_side([train], cores[1:], seconds)[0]
            engine_both, learner_both = _side_by_side([generate, train], cores, seconds)
            engine_f.append(engine_alone / engine_both)
            learner_f.append(learner_alone / learner_both)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(engine_f), statistics.median(learner_f)
