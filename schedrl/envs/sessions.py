"""Per-episode sessions and the pool that keeps them warm.

A session is what one episode holds of an environment outside the process: an MCP server of its own
(`schedrl.envs.tools.mcp`, `session: episode`), started in the sandbox when asked. The episode gets
one at reset and gives it back at close; nothing of one episode's state reaches another's, so a session
given back is either recycled (cleared by the server's own reset, then kept warm for the next episode)
or destroyed.

`SessionPool(start, close, size, recycle)`: `size` is the scheduling knob, how many sessions the pool
keeps ready. `acquire` takes an idle one (a hit) or waits for one being started for the pool, and starts
one itself (a cold start, on the episode's time) only when none is idle or coming; each acquire tops
the pool back up in the background (with a recycle, sessions lent out count as coming back). `release`
recycles the session when a recycle is given, the session is healthy and the pool has room, and
destroys it otherwise. `size: 0` is no pool: every episode starts its own session and destroys it at
close. `stats` counts acquires, hits, cold starts, recycles and the seconds each took; `pool_metrics()`
sums them over the process's pools, as the run's `session/*` metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from typing import Generic, TypeVar

S = TypeVar("S")


@dataclass
class PoolStats:
    acquired: int = 0
    hits: int = 0  # acquires served by an idle session
    cold_starts: int = 0  # sessions an episode started itself
    warm_starts: int = 0  # sessions started for the pool, ahead of the episodes that took them
    start_s: float = 0.0  # seconds spent starting sessions, cold and warm
    wait_s: float = 0.0  # seconds episodes waited in acquire
    recycled: int = 0
    recycle_s: float = 0.0
    destroyed: int = 0
    failed: int = 0  # starts or recycles that raised


class SessionPool(Generic[S]):
    """Sessions for episodes, `size` of them kept idle and ready (module doc)."""

    def __init__(
        self,
        start: Callable[[], Awaitable[S]],
        close: Callable[[S], Awaitable[None]],
        size: int = 0,
        recycle: Callable[[S], Awaitable[None]] | None = None,
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"session pool size must be an integer >= 0, got {size!r}")
        self._start, self._close, self._recycle, self.size = start, close, recycle, size
        self.idle: list[S] = []
        self.out = 0  # sessions lent to episodes
        self._coming: set[asyncio.Task] = set()  # starts for the pool, not yet idle
        self.stats = PoolStats()

    async def acquire(self) -> S:
        """An idle session, or one being started for the pool, or (none of those) a cold start."""
        self.stats.acquired += 1
        self.out += 1
        t0 = time.perf_counter()
        try:
            if self.idle:
                self.stats.hits += 1
                return self.idle.pop()
            if not self._coming:
                self.stats.cold_starts += 1
                return await self._timed_start()
            while not self.idle:  # starts for the pool are under way: wait for them, not a start of our own
                if not self._coming:  # they failed, or other episodes took what they started
                    self.stats.cold_starts += 1
                    return await self._timed_start()
                await asyncio.wait(set(self._coming), return_when=asyncio.FIRST_COMPLETED)
            return self.idle.pop()
        finally:
            self.stats.wait_s += time.perf_counter() - t0
            self.fill()

    async def release(self, session: S, healthy: bool = True) -> None:
        """Recycle `session` into the pool, or destroy it (no recycle, unhealthy, a full pool, or the
        recycle raised)."""
        self.out -= 1
        if self._recycle is not None and healthy and len(self.idle) + len(self._coming) < self.size:
            t0 = time.perf_counter()
            try:
                await self._recycle(session)
            except Exception:  # a session that cannot clear itself is not reused
                self.stats.failed += 1
            else:
                self.stats.recycled += 1
                self.stats.recycle_s += time.perf_counter() - t0
                self.idle.append(session)
                return
        self.stats.destroyed += 1
        await self._close(session)
        self.fill()

    def fill(self) -> None:
        """Start sessions in the background until `size` are idle or coming (on the running loop); with
        a recycle, those lent out count too: they come back."""
        lent = self.out if self._recycle is not None else 0
        while len(self.idle) + len(self._coming) + lent < self.size:
            task = asyncio.get_running_loop().create_task(self._warm())
            self._coming.add(task)
            task.add_done_callback(self._coming.discard)

    async def close(self) -> None:
        """Destroy every idle session; cancel the starts under way."""
        for task in list(self._coming):
            task.cancel()
        await asyncio.gather(*self._coming, return_exceptions=True)
        idle, self.idle = self.idle, []
        for s in idle:
            await self._close(s)

    async def _warm(self) -> None:
        try:
            session = await self._timed_start()
        except Exception:
            self.stats.failed += 1
            return
        self.stats.warm_starts += 1
        self.idle.append(session)

    async def _timed_start(self) -> S:
        t0 = time.perf_counter()
        session = await self._start()
        self.stats.start_s += time.perf_counter() - t0
        return session


POOLS: dict[tuple, SessionPool] = {}  # (event loop id, what the sessions are of) -> its pool


def pool_for(key: tuple, make: Callable[[], SessionPool]) -> SessionPool:
    """The running event loop's pool under `key`, made by `make` on first use."""
    full = (id(asyncio.get_running_loop()), *key)
    pool = POOLS.get(full)
    if pool is None:
        pool = POOLS[full] = make()
    return pool


async def close_pools() -> None:
    """Close the running event loop's pools (their idle sessions destroyed); their counts stay in
    `pool_metrics` no longer."""
    loop = id(asyncio.get_running_loop())
    for key in [k for k in POOLS if k[0] == loop]:
        await POOLS.pop(key).close()


def pool_metrics() -> dict[str, float]:
    """The process's pools summed: `session/acquired`, `session/hit_rate`, `session/cold_starts`,
    `session/start_s_mean` (a session's start, cold or warm), `session/recycle_s_mean`, ...; {} before
    any episode took a session."""
    total = PoolStats()
    for pool in POOLS.values():
        for f in fields(PoolStats):
            setattr(total, f.name, getattr(total, f.name) + getattr(pool.stats, f.name))
    if not total.acquired:
        return {}
    starts = total.cold_starts + total.warm_starts
    return {
        "session/acquired": float(total.acquired),
        "session/hit_rate": total.hits / total.acquired,
        "session/cold_starts": float(total.cold_starts),
        "session/start_s_mean": total.start_s / starts if starts else 0.0,
        "session/wait_s_mean": total.wait_s / total.acquired,
        "session/recycled": float(total.recycled),
        "session/recycle_s_mean": total.recycle_s / total.recycled if total.recycled else 0.0,
        "session/destroyed": float(total.destroyed),
        "session/failed": float(total.failed),
    }
