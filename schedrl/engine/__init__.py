"""Generation engines: the `Engine` protocol and the built-in continuous-batching engine."""

from schedrl.engine.admission import (
    FCFS,
    AdmissionPolicy,
    Priority,
    StaticBatch,
)
from schedrl.engine.base import Engine, ParkingEngine, StepStats
from schedrl.engine.hf import EngineConfig, HFEngine

__all__ = [
    "FCFS",
    "AdmissionPolicy",
    "Engine",
    "EngineConfig",
    "HFEngine",
    "ParkingEngine",
    "StepStats",
    "Priority",
    "StaticBatch",
]
