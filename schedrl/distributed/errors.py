"""How a worker fails, as the loop sees it."""

from __future__ import annotations


class WorkerDiedError(RuntimeError):
    """A worker process died (killed, out of memory, crashed)."""


class InputLostError(WorkerDiedError):
    """A call's input is gone with the worker or node that held it (a learner's weights, after its node
    died): the worker that was called is alive, and starting it again would not help."""


class WorkerStuckError(RuntimeError):
    """A worker has not answered a call for longer than `pipeline.worker_timeout_s`."""
