"""Every protocol a user implements to extend schedrl, in one place, each with what it promises.

| protocol | what it decides or does | defined in | registry (config key) |
|---|---|---|---|
| `Engine`, `ParkingEngine` | generate one decode step at a time; abort, resume, swap weights | `engine/base.py` | `ENGINES` (`engine.backend`) |
| `AdmissionPolicy` | which waiting requests enter the running batch | `engine/admission.py` | `ADMISSION` (`schedule.admission`) |
| `ToolWaitPolicy` | what a trajectory holds while its tool runs | `rollout/tool_wait/base.py` | `TOOL_WAITS` (`schedule.tool_wait`) |
| `RolloutMode` | how a step's samples are produced (plain, pruning, speculative) | `rollout/modes.py` | `ROLLOUT_MODES` (`schedule.rollout`) |
| `WeightSync` | when new weights reach the engines | `orchestrate/weight_sync/base.py` | `WEIGHT_SYNC` (`schedule.weight_sync`) |
| `Consumption` | which complete groups form an update's batch | `orchestrate/consumption/base.py` | `CONSUMPTION` (`schedule.consumption`) |
| `DataScheduler` | which tasks a step trains on, how many samples each | `data/base.py` | `SCHEDULERS` (`schedule.data`) |
| `TaskSource` | tasks and their rewards | `envs/base.py` | `TASKS` (`task.name`) |
| `Environment` | a multi-turn episode: reset, step, close | `envs/environment.py` | `ENVIRONMENTS` (`task.env`) |
| `CallParser` | tool calls in a model turn | `envs/tools/parsers.py` | `PARSERS` (`task.env_args.parser`) |
| `LossSpec` | what a loss needs from the learner, and its `Args` | `algos/spec.py` | `LOSSES` (`algo.loss`) |
| `Backend` | where workers run: Ray actors, threads, this process | `contracts/workers.py` | `WORKER_BACKENDS` (`pipeline.backend`) |
| `Fleet`, `Trainer`, `LearnerBatch` | the engines and the learner the pipeline's workers are | `contracts/workers.py` | |
| `Cluster` | engines and a learner on one clock, as the loop drives them (real: `Pipeline`; virtual: `ClusterSim`) | `orchestrate/loop.py` | |

Where to add X: write one file beside the others of its kind (a policy declares its arguments as a
frozen `Args` dataclass, its rules as class attributes such as `off_policy` or `parks`), register it
(`@REGISTRY.register("name")`) or name it by dotted path (`pkg.module:Class`) in the config, and copy
the tests of a sibling: `tests/test_registry_contract.py` checks every registered entry's `Args`;
`tests/test_pipeline_policies.py` (weight sync, consumption), `tests/test_tool_wait.py`,
`tests/test_rollout_ordering.py` (admission), `tests/test_data_protocol.py`, `tests/test_loss_specs.py`,
`tests/test_engine_contract.py` (an engine), `tests/test_envs.py` (tasks, environments).

Names resolve on first use, so importing this package loads nothing else.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

HOMES = {
    "Engine": "schedrl.engine.base",
    "ParkingEngine": "schedrl.engine.base",
    "AdmissionPolicy": "schedrl.engine.admission",
    "ToolWaitPolicy": "schedrl.rollout.tool_wait.base",
    "RolloutMode": "schedrl.rollout.modes",
    "WeightSync": "schedrl.orchestrate.weight_sync.base",
    "Consumption": "schedrl.orchestrate.consumption.base",
    "DataScheduler": "schedrl.data.base",
    "TaskSource": "schedrl.envs.base",
    "Environment": "schedrl.envs.environment",
    "CallParser": "schedrl.envs.tools.parsers",
    "LossSpec": "schedrl.algos.spec",
    "Backend": "schedrl.contracts.workers",
    "Cluster": "schedrl.orchestrate.loop",
    "Fleet": "schedrl.contracts.workers",
    "Trainer": "schedrl.contracts.workers",
    "LearnerBatch": "schedrl.contracts.workers",
}
__all__ = [
    "AdmissionPolicy",
    "Backend",
    "CallParser",
    "Cluster",
    "Consumption",
    "DataScheduler",
    "Engine",
    "Environment",
    "Fleet",
    "LearnerBatch",
    "LossSpec",
    "ParkingEngine",
    "RolloutMode",
    "TaskSource",
    "ToolWaitPolicy",
    "Trainer",
    "WeightSync",
]

if TYPE_CHECKING:
    from schedrl.algos.spec import LossSpec
    from schedrl.contracts.workers import Backend, Fleet, LearnerBatch, Trainer
    from schedrl.data.base import DataScheduler
    from schedrl.engine.admission import AdmissionPolicy
    from schedrl.engine.base import Engine, ParkingEngine
    from schedrl.envs.base import TaskSource
    from schedrl.envs.environment import Environment
    from schedrl.envs.tools.parsers import CallParser
    from schedrl.orchestrate.consumption.base import Consumption
    from schedrl.orchestrate.loop import Cluster
    from schedrl.orchestrate.weight_sync.base import WeightSync
    from schedrl.rollout.modes import RolloutMode
    from schedrl.rollout.tool_wait.base import ToolWaitPolicy


def __getattr__(name: str) -> Any:
    if name not in HOMES:
        raise AttributeError(f"module 'schedrl.contracts' has no attribute {name!r}")
    return getattr(importlib.import_module(HOMES[name]), name)
