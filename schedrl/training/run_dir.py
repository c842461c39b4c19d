"""The on-disk layout of one run, its crash-safe metrics log and its reward plot.

A run directory holds ``config.yaml``, ``metrics.jsonl`` (one JSON object per logged step, appended
and fsynced), ``tb/`` (TensorBoard events), ``checkpoints/`` and ``reward.png``. On resume from a
checkpoint at step s, rows after s belong to the lost tail of the crashed run: they are dropped from
``metrics.jsonl`` and TensorBoard is told to purge them, so the recomputed steps are not duplicated.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class RunDir:
    """Paths of one run, all under ``root``."""

    root: Path
    """The run directory, ``<out_dir>/<name>``."""

    @property
    def config_path(self) -> Path:
        return self.root / "config.yaml"

    @property
    def metrics_path(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def tb_dir(self) -> Path:
        return self.root / "tb"

    @property
    def ckpt_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def plot_path(self) -> Path:
        return self.root / "reward.png"

    @classmethod
    def create(cls, out_dir: str | os.PathLike[str], name: str) -> RunDir:
        """Make ``out_dir/name`` with its ``tb/`` and ``checkpoints/``; refuse to reuse a run that logged."""
        run = cls(Path(out_dir) / name)
        if run.metrics_path.exists():
            raise FileExistsError(
                f"{run.root} already holds a run ({run.metrics_path} exists); pass --resume {run.root} "
                "to continue it, or choose another run name"
            )
        run.tb_dir.mkdir(parents=True, exist_ok=True)
        run.ckpt_dir.mkdir(parents=True, exist_ok=True)
        return run

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> RunDir:
        """An existing run: ``path`` must be a directory holding ``config.yaml``."""
        run = cls(Path(path))
        if not run.root.is_dir():
            raise FileNotFoundError(f"run directory {run.root} does not exist")
        if not run.config_path.is_file():
            raise FileNotFoundError(f"{run.config_path} is missing; is {run.root} a run directory?")
        return run


def _parse_jsonl(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(line, row) pairs of a metrics file; a torn last line (a write cut short by a kill) is dropped.

    Only the last line can be torn, because each row is written and fsynced before the next; invalid
    JSON earlier in the file is corruption and raises.
    """
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    pairs = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}: line {i + 1} is not valid JSON ({err}): {line[:80]!r}") from err
        if not isinstance(row, dict) or "step" not in row:
            raise ValueError(f"{path}: line {i + 1} is not an object with a 'step': {line[:80]!r}")
        pairs.append((line, row))
    return pairs


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``, in file order, skipping a torn trailing line."""
    return [row for _, row in _parse_jsonl(Path(path))]


def _truncate_after(path: Path, last_step: int) -> None:
    """Rewrite ``path`` keeping only rows with ``step <= last_step``, atomically (temp file + rename)."""
    if not path.exists():
        return
    kept = [line for line, row in _parse_jsonl(path) if row["step"] <= last_step]
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class MetricsLogger:
    """Appends one JSON row per ``log`` call to ``metrics.jsonl`` and mirrors numbers to the logging
    backends (`schedrl.training.loggers`: TensorBoard by default, W&B, MLflow).

    Each row is flushed (a crash of the process loses at most the row being written); ``sync()``
    fsyncs, and runs before every checkpoint, so the rows a checkpoint covers survive a machine
    crash too. With ``resume_step`` (the step of the checkpoint resumed from; -1 when none was
    written), rows with a later step and a torn last line are removed first, and TensorBoard events
    from step ``resume_step + 1`` on are purged.
    """

    def __init__(
        self,
        run: RunDir,
        resume_step: int | None = None,
        backends: tuple[str, ...] = ("tensorboard",),
        options: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        every: int = 1,
    ) -> None:
        from schedrl.training.loggers import make_sinks

        if resume_step is not None:
            if resume_step < -1:
                raise ValueError(f"MetricsLogger: resume_step must be >= -1; got resume_step={resume_step}")
            _truncate_after(run.metrics_path, resume_step)
        self.run = run
        run.root.mkdir(parents=True, exist_ok=True)
        self._file = run.metrics_path.open("a", encoding="utf-8")
        purge_step = None if resume_step is None else resume_step + 1
        self._sinks = make_sinks(backends, run.root, purge_step, options or {}, config or {})
        self.every = every
        self._closed = False

    def log(self, step: int, metrics: dict[str, Any], prefix: str = "") -> None:
        """Append ``{"step": step, prefix + key: value, ...}`` and write numbers as TensorBoard scalars
        (those of every `every`-th step; a prefixed row, such as an evaluation, always).

        The prefix (e.g. ``"eval/"``) goes on the JSON keys too, so eval and train rows of the same
        step stay distinguishable in ``metrics.jsonl``. Non-numeric values go to JSON only.
        """
        if self._closed:
            raise RuntimeError("MetricsLogger.log called after close()")
        row = {prefix + key: value for key, value in metrics.items()}
        if "step" in row:
            raise ValueError(f"MetricsLogger.log: 'step' is reserved; got metrics key {prefix}step")
        self._file.write(json.dumps({"step": step, **row}) + "\n")
        self._file.flush()
        if not prefix and step % self.every:
            return  # a step between mirrored ones: in metrics.jsonl only
        scalars = {tag: float(value) for tag, value in row.items() if _is_number(value)}
        for sink in self._sinks:
            sink.log(step, scalars)

    def flush(self) -> None:
        """Push pending backend events to disk (the JSON rows are already there)."""
        for sink in self._sinks:
            sink.flush()

    def sync(self) -> None:
        """fsync the rows written so far and flush the backends: call before writing a checkpoint."""
        os.fsync(self._file.fileno())
        self.flush()

    def close(self) -> None:
        """Close the metrics file and the TensorBoard writer; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._file.close()
        for sink in self._sinks:
            sink.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _moving_average(ys: list[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` points (fewer at the start)."""
    out, total = [], 0.0
    for i, y in enumerate(ys):
        total += y
        if i >= window:
            total -= ys[i - window]
        out.append(total / min(i + 1, window))
    return out


def _series(metrics: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the rows holding a finite number under ``key``, sorted by step."""
    pts = sorted(
        (row["step"], float(row[key]))
        for row in metrics
        if _is_number(row.get(key)) and math.isfinite(row[key])
    )
    return [s for s, _ in pts], [v for _, v in pts]


def plot_reward_curve(
    metrics: list[dict[str, Any]], path: Path, key: str = "reward_mean", title: str = ""
) -> Path:
    """Plot ``key`` against step with a trailing moving average, plus ``eval/pass@1`` markers if logged.

    The moving-average window is max(1, n // 20) points. Saves a PNG at dpi 120 and returns ``path``.
    """
    if not any(key in row for row in metrics):
        raise ValueError(f"plot_reward_curve: no metrics row has key {key!r}")
    import matplotlib

    matplotlib.use("Agg")  # headless: a training node has no display
    import matplotlib.pyplot as plt

    steps, values = _series(metrics, key)
    window = max(1, len(values) // 20)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    try:
        ax.plot(steps, values, marker="o", markersize=2.5, linewidth=0.8, alpha=0.35, label=key)
        ax.plot(steps, _moving_average(values, window), linewidth=2.0, label=f"{key} (moving avg, {window})")
        eval_steps, eval_values = _series(metrics, "eval/pass@1")
        if eval_steps:
            ax.plot(eval_steps, eval_values, "s", markersize=6, color="tab:red", label="eval pass@1")
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.set_title(title or f"{key} vs step")
        ax.grid(alpha=0.3)
        ax.legend(loc="best")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
    return path
