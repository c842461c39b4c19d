"""What follows every update, in both loops: evaluate, log, report progress, checkpoint.

The synchronous loop and the asynchronous pipeline call `after_update` with the same
arguments; only how the latest weights reach this process's engine and how a checkpoint
is written differ, and those come in as two callables.
"""

from __future__ import annotations

from collections.abc import Callable

from schedrl.orchestrate.build import Components
from schedrl.orchestrate.evaluate import run_eval

StepCallback = Callable[[int, dict[str, float]], None]


def after_update(
    c: Components,
    done: int,
    metrics: dict[str, float],
    on_step: StepCallback | None,
    load_latest: Callable[[], None],
    save: Callable[[int], None],
) -> None:
    """`done` updates are finished. `load_latest()` loads the newest weights into `c.engine` (for an
    evaluation); `save(done)` writes the checkpoint of exactly this version."""
    cfg = c.cfg
    if cfg.eval.every and done % cfg.eval.every == 0 and done < cfg.steps:
        load_latest()
        metrics |= {f"eval/{k}": v for k, v in run_eval(c).items()}
    c.logger.log(done, metrics)
    if on_step is not None:
        on_step(done, metrics)
    if done == cfg.steps or (cfg.save_every and done % cfg.save_every == 0):
        if done == cfg.steps:
            load_latest()
            c.state["eval_after"] = run_eval(c)
            c.logger.log(done, {f"eval/{k}": v for k, v in c.state["eval_after"].items()})
        save(done)


def pauses_after(cfg, done: int) -> bool:
    """Whether update `done` ends in an evaluation or a checkpoint, which must see exactly its version."""
    e, every = cfg.eval.every, cfg.save_every
    return bool((every and done % every == 0) or (e and done % e == 0))
