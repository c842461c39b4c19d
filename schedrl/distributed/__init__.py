"""Placement of the pipeline's workers (Ray actors or this process); the only package that imports Ray."""

from schedrl.distributed.backend import LocalBackend, RayBackend, WorkerDiedError, make_backend
from schedrl.distributed.workers import EngineWorker, LearnerWorker

__all__ = ["EngineWorker", "LearnerWorker", "LocalBackend", "RayBackend", "WorkerDiedError", "make_backend"]
