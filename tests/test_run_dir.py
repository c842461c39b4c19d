"""Run directory layout, crash-safe metrics log with resume truncation, TensorBoard mirror, reward plot."""

import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.summary.writer import event_file_writer

from schedrl.training.run_dir import MetricsLogger, RunDir, plot_reward_curve, read_metrics


def _scalars(tb_dir: Path, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def _new_run(tmp_path: Path) -> RunDir:
    run = RunDir.create(tmp_path, "run1")
    run.config_path.write_text("seed: 0\n")
    return run


def test_create_and_open_layout(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "out", "exp")
    root = tmp_path / "out" / "exp"
    assert run.root == root
    assert run.config_path == root / "config.yaml"
    assert run.metrics_path == root / "metrics.jsonl"
    assert run.plot_path == root / "reward.png"
    assert run.tb_dir.is_dir() and run.tb_dir == root / "tb"
    assert run.ckpt_dir.is_dir() and run.ckpt_dir == root / "checkpoints"
    with pytest.raises(FileNotFoundError, match="config.yaml"):
        RunDir.open(root)
    run.config_path.write_text("seed: 0\n")
    assert RunDir.open(root) == run
    with pytest.raises(FileNotFoundError, match="does not exist"):
        RunDir.open(tmp_path / "missing")


def test_create_refuses_run_with_metrics(tmp_path: Path) -> None:
    run = _new_run(tmp_path)
    RunDir.create(tmp_path, "run1")  # no metrics yet: reusing the directory is fine
    run.metrics_path.write_text('{"step": 0}\n')
    with pytest.raises(FileExistsError, match="--resume") as info:
        RunDir.create(tmp_path, "run1")
    assert str(run.root) in str(info.value)


def test_log_appends_jsonl_and_tensorboard(tmp_path: Path) -> None:
    run = _new_run(tmp_path)
    with MetricsLogger(run) as logger:
        logger.log(0, {"reward_mean": 0.25, "lr": 1e-5, "task": "addition"})
        logger.log(1, {"reward_mean": 0.5})
        logger.log(1, {"pass@1": 0.75}, prefix="eval/")
        # Rows are on disk before close: a kill here would keep them.
        assert len(run.metrics_path.read_text().splitlines()) == 3
    assert read_metrics(run.metrics_path) == [
        {"step": 0, "reward_mean": 0.25, "lr": 1e-5, "task": "addition"},
        {"step": 1, "reward_mean": 0.5},
        {"step": 1, "eval/pass@1": 0.75},
    ]
    assert _scalars(run.tb_dir, "reward_mean") == [(0, 0.25), (1, 0.5)]
    assert _scalars(run.tb_dir, "eval/pass@1") == [(1, 0.75)]
    assert "task" not in EventAccumulator(str(run.tb_dir)).Reload().Tags()["scalars"]


def test_log_rejects_step_key_and_use_after_close(tmp_path: Path) -> None:
    logger = MetricsLogger(_new_run(tmp_path))
    with pytest.raises(ValueError, match="reserved"):
        logger.log(0, {"step": 3})
    logger.close()
    logger.close()
    with pytest.raises(RuntimeError, match="after close"):
        logger.log(0, {"x": 1.0})


def test_resume_truncates_lost_tail_and_torn_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # TensorBoard reads event files in name order: time in seconds, host, pid, then a per-process counter.
    # A real resume is a later process; here both writers share a second and a pid, so restart the counter
    # to keep the resumed file sorting last (counters 9 and 10 would sort the wrong way round).
    monkeypatch.setattr(event_file_writer, "_global_uid", event_file_writer.AtomicCounter(0))
    run = _new_run(tmp_path)
    with MetricsLogger(run) as logger:
        for step in range(5):
            logger.log(step, {"reward_mean": float(step)})
    with run.metrics_path.open("a") as f:
        f.write('{"step": 5, "reward_me')  # a write cut short by SIGKILL
    assert [r["step"] for r in read_metrics(run.metrics_path)] == [0, 1, 2, 3, 4]

    with MetricsLogger(run, resume_step=2) as logger:
        assert [r["step"] for r in read_metrics(run.metrics_path)] == [0, 1, 2]
        logger.log(3, {"reward_mean": 30.0})
    assert read_metrics(run.metrics_path)[-1] == {"step": 3, "reward_mean": 30.0}
    assert all(json.loads(line) for line in run.metrics_path.read_text().splitlines())
    # TensorBoard purges the old steps >= 3 when it meets the resumed writer's purge_step.
    assert _scalars(run.tb_dir, "reward_mean") == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0)]


def test_read_metrics_rejects_corruption_before_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\nnot json\n{"step": 1}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_metrics(path)


def test_plot_reward_curve_writes_png(tmp_path: Path) -> None:
    rows = [{"step": s, "reward_mean": s / 40} for s in range(40)]
    rows += [{"step": 10, "eval/pass@1": 0.3}, {"step": 30, "eval/pass@1": 0.6}]
    out = plot_reward_curve(rows, tmp_path / "plots" / "reward.png", title="test run")
    assert out == tmp_path / "plots" / "reward.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_reward_curve_without_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'reward_mean'"):
        plot_reward_curve([{"step": 0, "loss": 1.0}], tmp_path / "r.png")
    assert not (tmp_path / "r.png").exists()


def test_resume_without_a_checkpoint_drops_every_row(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "r")
    with MetricsLogger(run) as log:
        log.log(0, {"eval/pass@1": 0.1})
        log.log(1, {"reward_mean": 0.2})
        log.sync()
    with MetricsLogger(run, resume_step=-1):
        pass
    assert read_metrics(run.metrics_path) == []
    with pytest.raises(ValueError, match="resume_step must be >= -1"):
        MetricsLogger(run, resume_step=-2)
