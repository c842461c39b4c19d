"""Placement of the pipeline's workers (Ray actors, threads or this process); the only package that imports Ray."""

from schedrl.distributed.backend import (
    LocalBackend,
    RayBackend,
    ThreadBackend,
    WorkerDiedError,
    WorkerStuckError,
    make_backend,
    stuck_message,
    wait_built,
)
from schedrl.distributed.workers import EngineWorker, LearnerWorker

__all__ = [
    "EngineWorker",
    "LearnerWorker",
    "LocalBackend",
    "RayBackend",
    "ThreadBackend",
    "WorkerDiedError",
    "WorkerStuckError",
    "make_backend",
    "stuck_message",
    "wait_built",
]
