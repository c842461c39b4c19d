"""A whole training run: the build, the warm start (SFT, the evaluation before RL, checkpoint 0), the
loop (in one process, `sync.run_sync`, or the asynchronous pipeline, `pipeline.run_pipeline`), and the
evaluation after."""

from __future__ import annotations

from schedrl.config import RunConfig
from schedrl.envs import TaskSource
from schedrl.orchestrate.after_update import StepCallback
from schedrl.orchestrate.build import Components, build, save_ref_model
from schedrl.orchestrate.evaluate import run_eval
from schedrl.orchestrate.pipeline import run_pipeline
from schedrl.orchestrate.sync import checkpoint, run_sync
from schedrl.training.run_dir import RunDir, plot_reward_curve, read_metrics
from schedrl.training.sft import sft_warmup


def warm_start(c: Components, on_sft_step: StepCallback | None = None) -> None:
    """SFT warm-up, then the evaluation before RL; checkpointed as step 0."""
    cfg = c.cfg
    losses = sft_warmup(
        c.model,
        c.tokenizer,
        c.source,
        cfg.sft,
        cfg.seed,
        (lambda s, loss: on_sft_step(s, {"sft_loss": loss})) if on_sft_step else None,
    )
    c.engine.update_weights(c.model.state_dict(), version=0)
    if c.learner.ref_model is not None:  # the KL term's reference is the policy RL starts from, after SFT
        c.learner.ref_model.load_state_dict(c.model.state_dict())
    save_ref_model(c)
    c.state["eval_before"] = run_eval(c)
    row = {f"eval/{k}": v for k, v in c.state["eval_before"].items()}
    if losses:
        row |= {"sft_loss_first": losses[0], "sft_loss_last": losses[-1]}
    c.logger.log(0, row)
    checkpoint(c, 0)


def train(
    cfg: RunConfig,
    run: RunDir,
    resume: bool = False,
    on_step: StepCallback | None = None,
    on_sft_step: StepCallback | None = None,
    source: TaskSource | None = None,
) -> dict:
    """Run (or resume) a whole training run; returns the before/after evaluation. `source` replaces the
    task that `cfg.task` names (tasks built from objects: `schedrl.Trainer`)."""
    c = build(cfg, run, resume, source)
    try:
        if c.start_step is None:
            warm_start(c, on_sft_step)
        if cfg.pipeline.mode == "async":
            run_pipeline(c, on_step)
        else:
            run_sync(c, on_step)
        if "eval_after" not in c.state:  # resumed after the last step had been saved
            c.state["eval_after"] = run_eval(c)
    finally:
        c.logger.close()
        if c.rollout is not None:
            c.rollout.close()
        close = getattr(c.engine, "close", None)  # vLLM's: shut down now, not whenever it is collected
        if close is not None:
            close()
    plot_reward_curve(
        read_metrics(run.metrics_path), run.plot_path, title=f"{cfg.task.name}: reward per step"
    )
    return {
        "eval_before": c.state.get("eval_before", {}),
        "eval_after": c.state["eval_after"],
        "run_dir": str(run.root),
        "plot": str(run.plot_path),
    }
