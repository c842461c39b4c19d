"""Confined execution of model-written code: `Sandbox`, `SandboxPool`, `Limits`, `SandboxResult`."""

from schedrl.sandbox.limits import Limits, SandboxResult
from schedrl.sandbox.pool import SandboxPool
from schedrl.sandbox.sandbox import Sandbox, SandboxUnavailable

__all__ = ["Limits", "Sandbox", "SandboxPool", "SandboxResult", "SandboxUnavailable"]
