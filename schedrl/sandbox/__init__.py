"""Confined execution of model-written code: `Sandbox`, `SandboxPool`, `Limits`, `SandboxResult`."""

from schedrl.sandbox.pool import SandboxPool
from schedrl.sandbox.sandbox import Limits, Sandbox, SandboxResult, SandboxUnavailable

__all__ = ["Limits", "Sandbox", "SandboxPool", "SandboxResult", "SandboxUnavailable"]
