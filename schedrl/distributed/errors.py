"""How a worker fails, as the loop sees it."""

from __future__ import annotations


class WorkerDiedError(RuntimeError):
    """A worker process died (killed, out of memory, crashed)."""


class WorkerStuckError(RuntimeError):
    """A worker has not answered a call for longer than `pipeline.worker_timeout_s`."""
