"""Per-episode sessions: the pool's counts in closed form (no pool, a recycling pool, a pool refilled in
the background), nothing leaked or lent twice under concurrency, a recycle that fails destroys; through
MCP, an episode's notebook never reaches another episode (each its own server, or one recycled by its
`reset` tool), where a shared session leaks it; the pool's counts reach a run's metrics."""

from __future__ import annotations

import asyncio
import sys

import pytest

from schedrl.envs.sessions import POOLS, SessionPool, close_pools, pool_metrics


class Fake:
    """Sessions that count their starts and closes; `recycle` fails on demand."""

    def __init__(self, fail_recycle: bool = False) -> None:
        self.started, self.closed, self.lent, self.fail_recycle = 0, 0, set(), fail_recycle

    async def start(self) -> int:
        await asyncio.sleep(0.001)
        self.started += 1
        return self.started

    async def close(self, s: int) -> None:
        self.closed += 1

    async def recycle(self, s: int) -> None:
        if self.fail_recycle:
            raise RuntimeError("cannot clear")

    def pool(self, size: int, recycle: bool) -> SessionPool[int]:
        return SessionPool(self.start, self.close, size, self.recycle if recycle else None)


async def episodes(pool: SessionPool[int], fake: Fake, n: int, settle: bool = True) -> None:
    """`n` episodes one after another, each holding its session for a moment."""
    for _ in range(n):
        s = await pool.acquire()
        assert s not in fake.lent, "a session lent to two episodes at once"
        fake.lent.add(s)
        await asyncio.sleep(0.01 if settle else 0)  # the background starts finish meanwhile
        fake.lent.discard(s)
        await pool.release(s)


def test_no_pool_starts_and_destroys_a_session_per_episode():
    fake = Fake()
    pool = fake.pool(0, recycle=True)
    asyncio.run(episodes(pool, fake, 3))
    st = pool.stats
    assert (st.acquired, st.hits, st.cold_starts, st.warm_starts, st.destroyed) == (3, 0, 3, 0, 3)
    assert fake.started == fake.closed == 3


def test_a_recycling_pool_starts_once():
    fake = Fake()
    pool = fake.pool(1, recycle=True)
    asyncio.run(episodes(pool, fake, 3))
    st = pool.stats
    assert (st.hits, st.cold_starts, st.warm_starts, st.recycled, st.destroyed) == (2, 1, 0, 3, 0)
    assert fake.started == 1 and pool.idle == [1]


def test_a_pool_without_recycle_refills_in_the_background():
    fake = Fake()
    pool = fake.pool(2, recycle=False)

    async def go():
        await episodes(pool, fake, 3)
        await asyncio.sleep(0.01)
        await pool.close()

    asyncio.run(go())
    st = pool.stats
    # the first episode starts cold and the pool fills 2 behind it; each later one takes an idle session
    # and one more is started in its place; every session is used once, then destroyed
    assert (st.hits, st.cold_starts, st.warm_starts, st.recycled, st.destroyed) == (2, 1, 4, 0, 3)
    assert fake.started == fake.closed == 5


def test_concurrent_episodes_never_share_and_nothing_leaks():
    fake = Fake()
    pool = fake.pool(2, recycle=True)

    async def go():
        await asyncio.gather(*(episodes(pool, fake, 5, settle=False) for _ in range(4)))
        await pool.close()

    asyncio.run(go())
    assert pool.stats.acquired == 20 and pool.stats.hits > 0
    assert fake.started == fake.closed and not pool.idle


def test_a_session_that_cannot_be_recycled_is_destroyed():
    fake = Fake(fail_recycle=True)
    pool = fake.pool(1, recycle=True)

    async def go():
        await episodes(pool, fake, 2)
        await pool.close()

    asyncio.run(go())
    st = pool.stats  # each destroyed session is replaced in the background: the second episode waits
    assert (st.failed, st.recycled, st.destroyed, st.cold_starts, st.hits) == (2, 0, 2, 1, 0)  # for it
    assert fake.started == fake.closed


def test_bad_pool_sizes_are_named():
    fake = Fake()
    with pytest.raises(ValueError, match=r"session pool size must be an integer >= 0, got -1"):
        fake.pool(-1, recycle=False)


# ---- through MCP --------------------------------------------------------------------------------

NOTES = {"command": sys.executable, "args": ["-m", "schedrl.envs.tools.mcp_notes_server"]}


def notebooks(server: dict, concurrent: bool) -> tuple[str, str, dict[str, float]]:
    """Two episodes: the first writes a note; the second reads it back (after the first closed, or while
    it is still open)."""
    pytest.importorskip("mcp", reason="the MCP SDK is the optional extra schedrl[mcp]")
    from schedrl.envs import make_task
    from schedrl.envs.tool_env import tool_env

    source = make_task("calc", min_digits=2, max_digits=2)
    task = source.sample("train", 1, seed=0)[0]

    async def play():
        first, second = (tool_env(source, mcp=[server]) for _ in range(2))
        await first.reset(task, 0)
        await first.tools.tools["write"].fn(key="k", value="secret")
        if not concurrent:
            await first.close()
        await second.reset(task, 1)
        seen = await second.tools.tools["read"].fn(key="k")
        mine = await first.tools.tools["read"].fn(key="k") if concurrent else "-"
        await second.close()
        if concurrent:
            await first.close()
        out = (seen, mine, pool_metrics())
        await close_pools()
        return out

    return asyncio.run(play())


@pytest.mark.subprocess
def test_each_episode_has_a_notebook_of_its_own():
    seen, mine, metrics = notebooks({**NOTES, "session": "episode"}, concurrent=True)
    assert (seen, mine) == ("(none)", "secret")
    assert metrics["session/acquired"] == 2 and metrics["session/cold_starts"] == 2
    seen, _, metrics = notebooks({**NOTES, "session": "episode", "pool": 1, "recycle": "reset"}, False)
    assert seen == "(none)"  # the same server, recycled: its reset cleared the notebook
    assert metrics["session/hit_rate"] == 0.5 and metrics["session/recycled"] == 2
    assert metrics["session/cold_starts"] == 1
    assert not POOLS, "close_pools left a pool behind"
    seen, _, _ = notebooks(NOTES, concurrent=False)  # one shared session: the note leaks
    assert seen == "secret"


def test_bad_session_settings_are_named():
    from schedrl.envs.tools.mcp import MCPServer

    with pytest.raises(ValueError, match=r"session must be 'shared' or 'episode', got 'trajectory'"):
        MCPServer.of({**NOTES, "session": "trajectory"})
    with pytest.raises(ValueError, match=r"pool and recycle are settings of session: episode"):
        MCPServer.of({**NOTES, "pool": 2})
    with pytest.raises(ValueError, match=r"pool must be an integer >= 0 .*, got 'big'"):
        MCPServer.of({**NOTES, "session": "episode", "pool": "big"})


@pytest.mark.sandbox
def test_per_episode_servers_in_sandboxes_of_their_own():
    from schedrl.sandbox.sandbox import unavailable_reason

    if reason := unavailable_reason():
        pytest.skip(reason)
    seen, mine, metrics = notebooks({**NOTES, "session": "episode", "sandbox": True}, concurrent=True)
    assert (seen, mine) == ("(none)", "secret") and metrics["session/cold_starts"] == 2


@pytest.mark.train
def test_a_run_logs_its_session_pool(tmp_path):
    """The synchronous loop's episodes take per-episode sessions from the pool; its counts are logged."""
    pytest.importorskip("mcp", reason="the MCP SDK is the optional extra schedrl[mcp]")
    import schedrl
    from schedrl.training.run_dir import read_metrics

    server = {**NOTES, "session": "episode", "pool": 4, "recycle": "reset"}
    cfg = {
        "steps": 2, "save_every": 0, "out_dir": str(tmp_path), "name": "pooled", "sft": {"steps": 5},
        "eval": {"tasks": 0}, "min_start_reward": -1.0, "logging": {"backends": ["jsonl"]},
        "task": {"name": "calc", "args": {"min_digits": 2, "max_digits": 2}, "env": "tools",
                 "env_args": {"tools": ["schedrl.envs.calc:calc"], "mcp": [server]}, "max_turns": 2},
        "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 8},
    }  # fmt: skip
    schedrl.train(cfg)
    rows = [r for r in read_metrics(tmp_path / "pooled" / "metrics.jsonl") if "loss" in r]
    assert [r["session/acquired"] for r in rows] == [4.0, 8.0]  # cumulative: 4 episodes a step
    # how many of the second step's episodes find a recycled session idle depends on when the first
    # step's episodes end (bench/env_sessions.py measures it): some must
    assert rows[-1]["session/hit_rate"] > 0 and rows[-1]["session/recycled"] >= 3
    assert not POOLS, "the run left a session pool open"
