"""Logging backends: W&B offline and MLflow's file store read back, resume into the same run, and
missing extras named by their pip command."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from schedrl.api import resolve_config
from schedrl.config import ConfigError, config_from_dict
from schedrl.training.run_dir import MetricsLogger, RunDir


def _log_steps(run: RunDir, backends, steps, resume_step=None, **options) -> None:
    logger = MetricsLogger(
        run, resume_step=resume_step, backends=backends, options=options, config={"seed": 3}
    )
    for step in steps:
        logger.log(step, {"reward_mean": step / 10, "note": "text goes to JSON only"})
    logger.close()


def test_mlflow_file_store_holds_every_step_and_resume_continues_the_same_run(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    run = RunDir.create(tmp_path, "ml")
    _log_steps(run, ("jsonl", "mlflow"), [1, 2, 3])
    run_id = (run.root / "mlflow_run_id").read_text()
    _log_steps(run, ("jsonl", "mlflow"), [3, 4], resume_step=2)  # step 3 recomputed after a resume
    client = MlflowClient(tracking_uri=(run.root / "mlruns").resolve().as_uri())
    history = client.get_metric_history(run_id, "reward_mean")
    assert sorted({(m.step, m.value) for m in history}) == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
    assert client.get_run(run_id).data.params["seed"] == "3"
    assert len(client.search_runs([client.get_run(run_id).info.experiment_id])) == 1  # one run, resumed


def _wandb_records(path):
    """The protobuf records of a `.wandb` file. The format is LevelDB's log (32 KiB blocks of records,
    each with a 7-byte header: crc32c, length, type) after a 7-byte W&B header; W&B's own Python
    reader is gone from the client, so the test reads it here."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a W&B transaction log"
    pos, block, payload = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        payload += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, or LAST of a record split over blocks
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            yield record
            payload = b""
        elif kind == 0:
            break


@pytest.mark.subprocess
def test_wandb_offline_run_holds_the_logged_values(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = RunDir.create(tmp_path, "wb")
    _log_steps(run, ("jsonl", "wandb"), [1, 2, 5], wandb_mode="offline", project="schedrl-test")
    (offline,) = (run.root / "wandb").glob("offline-run-*")
    (log,) = offline.glob("run-*.wandb")
    deadline = time.time() + 30
    records = list(_wandb_records(log))
    while not any(r.WhichOneof("record_type") == "exit" for r in records):  # W&B's service writes on its own
        assert time.time() < deadline, "the W&B log never got its exit record"
        time.sleep(0.2)
        records = list(_wandb_records(log))
    history, config = [], {}
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = record.history.item
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
        elif kind in ("config", "run"):  # the config comes with the run record, and in later updates
            updates = record.config.update if kind == "config" else record.run.config.update
            config |= {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in updates}
    assert [(h["_step"], h["reward_mean"]) for h in history] == [(1, 0.1), (2, 0.2), (5, 0.5)]
    assert config["seed"] == 3
    assert (run.root / "wandb_id").read_text() in offline.name


def test_a_missing_extra_is_named_with_its_pip_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'schedrl\[wandb\]'"):
        MetricsLogger(RunDir.create(tmp_path, "x"), backends=("wandb",))
    monkeypatch.setitem(sys.modules, "ray", None)
    from schedrl.distributed.backend import RayBackend

    with pytest.raises(ImportError, match=r"pip install 'schedrl\[ray\]'"):
        RayBackend()


def test_unknown_backends_are_refused_by_the_config():
    with pytest.raises(ConfigError, match="'logging.backends' has 'neptune'"):
        resolve_config({"logging": {"backends": ["jsonl", "neptune"]}})
    assert config_from_dict({"logging": {"backends": ["mlflow"]}}).logging.backends == ("mlflow",)


def test_a_missing_extra_fails_before_the_run_starts_with_its_command(tmp_path, monkeypatch, capsys):
    import importlib.util

    from schedrl.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in ("ray", "mlflow") else real(name, *a)
    )
    out = str(tmp_path / "runs")
    for sets in (
        ["pipeline.mode=async", "pipeline.backend=ray", "algo.correction=decoupled"],
        ["logging.backends=[mlflow]"],
    ):
        args = [a for s in [*sets, f"out_dir={out}"] for a in ("--set", s)]
        assert main(["train", str(Path(__file__).parents[1] / "examples" / "demo.yaml"), *args]) == 2
    text = capsys.readouterr().out
    assert (
        "pip install 'schedrl[ray]'" in text and "pip install 'schedrl[mlflow]'" in text
    )  # not eaten as markup
    assert not (tmp_path / "runs").exists()
