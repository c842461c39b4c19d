"""The contracts package gathers every protocol a user implements; the loop's worker seam is typed."""

from __future__ import annotations

import subprocess
import sys

import pytest

import schedrl.contracts as contracts
from schedrl.api import resolve_config
from schedrl.config import ConfigError
from schedrl.contracts import LearnerBatch
from schedrl.distributed.backend import WORKER_BACKENDS, LocalBackend, make_backend, remote
from schedrl.engine.registry import ENGINES
from schedrl.training.loggers import LOGGERS


class Serial(LocalBackend):
    """A user's worker backend, named by dotted path."""

    name = "serial"


def test_every_contract_resolves_and_says_what_it_promises():
    for name in contracts.__all__:
        obj = getattr(contracts, name)
        assert obj.__name__ == name and (obj.__doc__ or "").strip(), name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        contracts.Nope  # noqa: B018


def test_importing_the_contracts_loads_nothing_heavy():
    code = "import sys, schedrl.contracts; print('torch' in sys.modules, 'schedrl.engine' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_a_learner_batch_holds_one_row_per_sample():
    row = dict(prompt_ids=[[1]], token_ids=[[2]], logprobs=[[-0.1]], versions=[[0]], train_mask=[[True]])
    batch = LearnerBatch(**row, advantages=[0.5], request_ids=["r0"], max_staleness=0)
    assert batch.request_ids == ["r0"]
    with pytest.raises(ValueError, match=r"one row per sample, got lengths \[1, 2\]"):
        LearnerBatch(**row, advantages=[0.5, 0.1], request_ids=["r0"], max_staleness=0)


class Echo:
    def twice(self, x: int, y: int = 0) -> int:
        return 2 * x + y


def test_a_remote_call_is_the_method_by_reference():
    backend = LocalBackend()
    assert backend.get(remote(backend, Echo(), Echo.twice)(3, 1)) == 7
    with pytest.raises(TypeError, match="positional arguments only"):
        remote(backend, Echo(), Echo.twice)(3, y=1)


def test_the_switches_are_registries():
    assert ENGINES.names() == ["builtin", "vllm"]
    assert ENGINES.get("builtin").features - ENGINES.get("vllm").features == {"park_slots"}
    assert WORKER_BACKENDS.names() == ["local", "ray", "threads"]
    assert LOGGERS.names() == ["mlflow", "tensorboard", "wandb"]
    assert isinstance(make_backend("test_contracts:Serial", num_engines=1), Serial)
    assert resolve_config({"pipeline": {"backend": "test_contracts:Serial"}}).pipeline.backend
    with pytest.raises(ConfigError, match=r"'pipeline.backend' must be one of local, ray, threads.*'slurm'"):
        resolve_config({"pipeline": {"backend": "slurm"}})
    with pytest.raises(ConfigError, match=r"'logging.backends' has 'neptune'; known: jsonl, mlflow"):
        resolve_config({"logging": {"backends": ["neptune"]}})
