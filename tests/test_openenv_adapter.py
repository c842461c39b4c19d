"""OpenEnv servers through the `openenv` adapter, on a server the test starts on loopback: an episode
equals driving OpenEnv's own client by hand; an action the server refuses is the turn's outcome; a pool
reuses sessions and each reset starts afresh; a server that does not answer in time ends its episodes
with reward 0, counted; a run trains on it; bad settings and a server that is not there are named."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("openenv.core", reason="the OpenEnv adapter needs the extra schedrl[openenv]")

from schedrl.envs import make_env, make_task  # noqa: E402
from schedrl.envs.openenv.adapter import OpenEnvTasks  # noqa: E402
from schedrl.envs.sessions import close_pools, pool_metrics  # noqa: E402


def serve(**game) -> tuple[str, object]:
    from schedrl.envs.openenv.guess_server import serve_in_thread

    return serve_in_thread(**game)


@pytest.fixture(scope="module")
def url():
    url, server = serve()
    yield url
    server.should_exit = True  # type: ignore[attr-defined]


def play(url: str, seed: int, turns: list[str], **env_args) -> list:
    source = make_task("openenv", url=url, observation_field="message")
    (task,) = [t for t in source.sample("train", 3, seed=0) if t.metadata["seed"] == seed] or [None]
    assert task is not None
    env = make_env("openenv", source, action_field="guess", **env_args)

    async def go():
        out: list = [(await env.reset(task, 99)).text]
        for t in turns:
            r = await env.step(t)
            out.append((None if r.observation is None else r.observation.text, r.reward, r.done))
            if r.done:
                break
        await env.close()
        await close_pools()
        return out

    return asyncio.run(go())


def by_hand(url: str, seed: int, guesses: list[int]) -> list:
    from openenv.core import GenericEnvClient

    async def go():
        async with GenericEnvClient(base_url=url) as client:
            out: list = [(await client.reset(seed=seed)).observation["message"]]
            for g in guesses:
                r = await client.step({"guess": g})
                out.append((None if r.done else r.observation["message"], r.reward, r.done))
                if r.done:
                    break
            return out

    return asyncio.run(go())


def test_an_episode_equals_driving_openenv_by_hand(url):
    source = OpenEnvTasks(url, observation_field="message")
    seeds = [t.metadata["seed"] for t in source.sample("train", 3, seed=0)]
    secret = __import__("random").Random(seeds[0]).randint(0, 63)
    guesses = [31, 15, 47, secret]
    assert play(url, seeds[0], [f" {g};" for g in guesses], stop=[";"]) == by_hand(url, seeds[0], guesses)
    assert play(url, seeds[0], [f"{secret}"])[-1] == (None, 1.0, True)


def test_a_refused_action_is_the_turns_outcome(url):
    source = OpenEnvTasks(url, observation_field="message")
    seed = source.sample("train", 1, seed=0)[0].metadata["seed"]
    out = play(url, seed, ["twelve", "12"])
    assert out[1] == ("invalid action", 0.0, False)  # refused: the episode goes on
    assert out[2][0] in ("+", "-", "=")  # the next turn's guess is the game's again


def test_a_pool_reuses_sessions_and_each_reset_starts_afresh(url):
    source = OpenEnvTasks(url, observation_field="message")
    tasks = source.sample("train", 4, seed=0)

    async def go():
        seen = []
        for t in tasks * 2:
            env = make_env("openenv", source, action_field="guess", pool=1)
            seen.append((await env.reset(t, 0)).text)
            seen.append((await env.step("70")).observation)  # out of range: '-' from any fresh game
            await env.close()
        metrics = pool_metrics()
        await close_pools()
        return seen, metrics

    seen, metrics = asyncio.run(go())
    assert metrics["session/acquired"] == 8 and metrics["session/cold_starts"] == 1
    assert metrics["session/hit_rate"] == 7 / 8
    assert all(o.text == "-" for o in seen[1::2])  # never 'out of guesses': each reset restarts the count


def test_a_server_that_does_not_answer_in_time_is_not_reused():
    """A step cut by the episode runner's timeout (`asyncio.wait_for`, under `task.env_timeout_s`; the
    runner ends such an episode with reward 0 and counts it, `test_episodes.py`) leaves its session
    broken: it is destroyed, not handed to the next episode with a stale answer in flight."""
    slow, server = serve(step_delay_s=1.0)
    try:
        source = OpenEnvTasks(slow, observation_field="message")
        (task,) = source.sample("train", 1, seed=0)

        async def go():
            env = make_env("openenv", source, action_field="guess", pool=1)
            await env.reset(task, 0)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(env.step("12"), 0.2)
            await env.close()
            metrics = pool_metrics()
            await close_pools()
            return metrics

        metrics = asyncio.run(go())
    finally:
        server.should_exit = True  # type: ignore[attr-defined]
    assert metrics["session/destroyed"] == 1 and metrics["session/recycled"] == 0


@pytest.mark.train
def test_a_run_trains_on_an_openenv_server(tmp_path, url):
    import schedrl
    from schedrl.training.run_dir import read_metrics

    cfg = {
        "steps": 2, "save_every": 0, "out_dir": str(tmp_path), "name": "oe", "sft": {"steps": 0},
        "eval": {"tasks": 4, "k": 1}, "min_start_reward": -1.0, "logging": {"backends": ["jsonl"]},
        "task": {"name": "openenv", "args": {"url": url, "observation_field": "message"}, "env": "openenv",
                 "env_args": {"action_field": "guess", "stop": [";"], "pool": 4}, "max_turns": 3},
        "sampling": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 12},
    }  # fmt: skip
    schedrl.train(cfg)
    rows = [r for r in read_metrics(tmp_path / "oe" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(r["turns_mean"] >= 1 for r in rows)
    assert rows[-1]["session/hit_rate"] > 0.5  # 4 sessions kept warm across 8 episodes


def test_bad_settings_and_a_missing_server_are_named():
    with pytest.raises(ValueError, match=r"url must be the server's http\(s\):// .* got 'localhost:1'"):
        OpenEnvTasks("localhost:1")
    with pytest.raises(ConnectionError, match=r"OpenEnv server 'http://127.0.0.1:9': cannot connect"):
        OpenEnvTasks("http://127.0.0.1:9", connect_timeout_s=1).sample("train", 1, 0)
    with pytest.raises(ValueError, match=r"env 'openenv' runs the 'openenv' task's server, got task 'sort'"):
        make_env("openenv", make_task("sort"))
