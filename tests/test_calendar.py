"""`calendar`: every generated day has a perfect booking (against brute force over all starts), the
environment's round rewards in closed form, and the warm-up transcript it accepts."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from schedrl.envs import make_env, make_task
from schedrl.envs.calendar import HOURS, CalendarEnv, CalendarTask, fits, perfect_day, preferred


def _brute(busy: set[int], meetings: list[int], likes: str) -> bool:
    for starts in itertools.product(range(HOURS), repeat=len(meetings)):
        b, ok = set(busy), True
        for s, h in zip(starts, meetings, strict=True):
            if not (fits(s, h, b) and preferred(s, h, likes)):
                ok = False
                break
            b |= set(range(s, s + h))
        if ok:
            return True
    return False


def test_the_search_finds_a_perfect_day_exactly_when_one_exists():
    for busy, meetings, likes in [
        ({0, 2, 4}, [1, 2], "am"),
        ({1, 3}, [2, 2], "am"),
        ({5, 7, 9}, [1, 1, 1], "pm"),
        (set(), [2, 2, 1], "am"),
        ({6}, [2, 2], "pm"),
    ]:
        assert (perfect_day(busy, meetings, likes) is not None) == _brute(busy, meetings, likes)


def _play(task, actions, round_reward=0.2):
    async def go():
        env = CalendarEnv(CalendarTask(), round_reward)
        await env.reset(task, 0)
        return [await env.step(a) for a in actions]

    return asyncio.run(go())


def test_round_rewards_and_the_outcome():
    src = CalendarTask()
    task = next(t for t in src.sample("train", 50, seed=0) if t.metadata["likes"] == "am")
    starts = task.answer.split(";")
    perfect = _play(task, [f"{s};" for s in starts])
    assert [r.reward for r in perfect] == pytest.approx([0.2, 0.2, 1.2])
    assert [r.done for r in perfect] == [False, False, True] and perfect[0].observation.text.startswith("ok ")
    # the same first booking twice: the second clashes, is not booked, and the day is no longer perfect
    clash = _play(task, [f"{starts[0]};", f"{starts[0]};", "x;"])
    assert [r.reward for r in clash] == pytest.approx([0.2, 0.0, 0.0])
    assert clash[1].observation.text.startswith("clash ")
    # a free hour outside the preference (an am person booked at 9) earns half a round and no outcome
    busy = set(task.metadata["busy"])
    late = next(s for s in range(5, HOURS) if fits(s, task.metadata["meetings"][0], busy))
    off = _play(task, [f"{late};", *(f"{s};" for s in starts[1:])])
    assert off[0].reward == pytest.approx(0.1) and off[-1].reward < 1.0


def test_every_day_has_a_perfect_transcript_the_rule_accepts():
    src = CalendarTask(rounds=3)
    for t in src.sample("train", 100, seed=1):
        m = t.metadata
        assert _brute(set(m["busy"]), m["meetings"], m["likes"])
        assert src.reward(t, src.solution(t)) == 1.0
        assert src.reward(t, "9;9;9;") == 0.0 or m["likes"] == "pm"


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="rounds"):
        make_task("calendar", rounds=0)
    with pytest.raises(ValueError, match="round_reward"):
        make_env("calendar", CalendarTask(), round_reward=1.5)
