"""Generation engines: the `Engine` protocol and the built-in continuous-batching engine."""

from schedrl.engine.admission import (
    ADMISSION_POLICIES,
    FCFS,
    AdmissionPolicy,
    Priority,
    StaticBatch,
    make_admission,
)
from schedrl.engine.base import Engine
from schedrl.engine.hf import EngineConfig, HFEngine

__all__ = [
    "ADMISSION_POLICIES",
    "FCFS",
    "AdmissionPolicy",
    "Engine",
    "EngineConfig",
    "HFEngine",
    "Priority",
    "StaticBatch",
    "make_admission",
]
