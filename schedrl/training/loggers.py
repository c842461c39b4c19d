"""Where a run's metrics are mirrored (`logging.backends`): TensorBoard, Weights & Biases, MLflow.

`metrics.jsonl` is always written (resume reads it); each backend here mirrors its numbers. W&B
(`pip install 'schedrl[wandb]'`) and MLflow (`pip install 'schedrl[mlflow]'`) are optional extras;
asking for one that is not installed is an error naming the command. On resume each continues the
same run: TensorBoard purges the events past the checkpoint, W&B and MLflow reopen the run whose id
the run directory keeps (`wandb_id`, `mlflow_run_id`), and log the recomputed steps again.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from schedrl.registry import Registry

# The mirrors of `metrics.jsonl`, each built as cls(root, purge_step, options, config); "jsonl" alone
# names the file itself, which the run directory always writes.
LOGGERS: Registry[Any] = Registry("logging backend")
JSONL = "jsonl"
EXTRAS = {"wandb": ("wandb", "W&B client"), "mlflow": ("mlflow", "MLflow client")}


class Sink(Protocol):
    def log(self, step: int, scalars: Mapping[str, float]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def _run_id(root: Path, name: str) -> tuple[str, bool]:
    """The id kept in `root/name` (and whether it was there), made on the first call."""
    path = root / name
    if path.is_file():
        return path.read_text().strip(), True
    run_id = uuid.uuid4().hex[:16]
    path.write_text(run_id)
    return run_id, False


def _require(backend: str) -> Any:
    module, what = EXTRAS[backend]
    try:
        return __import__(module)
    except ImportError:
        raise ImportError(
            f"logging backend {backend!r} needs the {what}: pip install 'schedrl[{backend}]'"
        ) from None


@LOGGERS.register("tensorboard")
class TensorBoardSink:
    """TensorBoard event files under `root/tb`; a resumed run purges the events past its checkpoint"""

    def __init__(
        self, root: Path, purge_step: int | None, options: Mapping[str, Any], config: Mapping[str, Any]
    ) -> None:
        from torch.utils.tensorboard import SummaryWriter  # heavy import, only when logging

        self.writer = SummaryWriter(str(root / "tb"), purge_step=purge_step)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, global_step=step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@LOGGERS.register("wandb")
class WandbSink:
    """One W&B run per run directory (its id in `wandb_id`), files under `root/wandb`."""

    def __init__(
        self, root: Path, purge_step: int | None, options: Mapping[str, Any], config: Mapping[str, Any]
    ) -> None:
        wandb = _require("wandb")
        run_id, existed = _run_id(root, "wandb_id")
        self.run = wandb.init(
            project=options.get("project") or "schedrl",
            name=root.name,
            id=run_id,
            resume="allow" if existed else None,
            dir=str(root),
            mode=options.get("wandb_mode"),
            config=dict(config),
            reinit="create_new",
        )

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def flush(self) -> None:
        pass  # the W&B service writes on its own

    def close(self) -> None:
        self.run.finish()


@LOGGERS.register("mlflow")
class MLflowSink:
    """One MLflow run per run directory (its id in `mlflow_run_id`); the store defaults to a file store
    in `root/mlruns` (MLflow 3 keeps file stores in maintenance mode: `logging.mlflow_tracking_uri` can
    name a database or a server instead)."""

    def __init__(
        self, root: Path, purge_step: int | None, options: Mapping[str, Any], config: Mapping[str, Any]
    ) -> None:
        mlflow = _require("mlflow")
        from mlflow.tracking import MlflowClient

        uri = options.get("mlflow_tracking_uri")
        if uri is None:  # a file store in the run directory; MLflow 3 asks for this opt-in to use one
            uri = (root / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        id_file = root / "mlflow_run_id"
        if id_file.is_file():
            self.run_id = id_file.read_text().strip()
        else:
            name = options.get("project") or "schedrl"
            experiment = self.client.get_experiment_by_name(name)
            exp_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
            run = self.client.create_run(exp_id, run_name=root.name)
            self.run_id = run.info.run_id
            id_file.write_text(self.run_id)
            for key, value in _flatten(config).items():
                self.client.log_param(self.run_id, key, str(value)[:500])
        self._mlflow = mlflow

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(__import__("time").time() * 1000)
        metrics = [Metric(_mlflow_key(k), float(v), now, step) for k, v in scalars.items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def flush(self) -> None:
        pass  # every batch is written when logged

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _mlflow_key(key: str) -> str:
    """MLflow keys allow letters, digits, _ - . space : / only."""
    return "".join(ch if ch.isalnum() or ch in "_-. :/" else "_" for ch in key)


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out |= _flatten(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def make_sinks(
    backends: tuple[str, ...],
    root: Path,
    purge_step: int | None,
    options: Mapping[str, Any],
    config: Mapping[str, Any],
) -> list[Sink]:
    """The mirrors `backends` name (`LOGGERS`, or `pkg.module:Sink`); `metrics.jsonl` is always written."""
    return [LOGGERS.get(name)(root, purge_step, options, config) for name in backends if name != JSONL]
