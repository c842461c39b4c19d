"""Several sandboxes at once: a pool of slots (one uid each) under a concurrency limit.

`await pool.run(...)` runs on a worker thread, so an episode's tool call waits on it like any other
asynchronous tool while the engine decodes the other episodes; `pool.run_sync(...)` blocks. At most
`size` runs are in flight; the others queue for a slot.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Mapping, Sequence

from schedrl.sandbox.limits import Limits, SandboxResult
from schedrl.sandbox.sandbox import Sandbox


class SandboxPool:
    def __init__(self, size: int = 4, limits: Limits | None = None, python: str | None = None) -> None:
        if size < 1:
            raise ValueError(f"SandboxPool.size must be >= 1, got {size!r}")
        self.size, self.limits = size, limits or Limits()
        self._free: queue.Queue[Sandbox] = queue.Queue()
        for _ in range(size):
            self._free.put(Sandbox(python=python))
        self.runs = 0

    def run_sync(
        self,
        code: str | None = None,
        argv: Sequence[str] | None = None,
        files: Mapping[str, str | bytes] | None = None,
        limits: Limits | None = None,
        collect: Sequence[str] = (),
    ) -> SandboxResult:
        box = self._free.get()  # waits for a slot
        try:
            self.runs += 1
            return box.run(code=code, argv=argv, files=files, limits=limits or self.limits, collect=collect)
        finally:
            self._free.put(box)

    async def run(
        self,
        code: str | None = None,
        argv: Sequence[str] | None = None,
        files: Mapping[str, str | bytes] | None = None,
        limits: Limits | None = None,
        collect: Sequence[str] = (),
    ) -> SandboxResult:
        return await asyncio.to_thread(self.run_sync, code, argv, files, limits, collect)
