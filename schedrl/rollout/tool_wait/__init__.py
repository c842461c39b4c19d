"""Tool-wait policies (`schedule.tool_wait`), one file each: release, lockstep, priority, pin."""

from schedrl.rollout.tool_wait.base import TOOL_WAITS, Back, ToolWaitPolicy, Turn, make_tool_wait
from schedrl.rollout.tool_wait.lockstep import LockStep
from schedrl.rollout.tool_wait.pin import Pin
from schedrl.rollout.tool_wait.priority import ReturnsFirst
from schedrl.rollout.tool_wait.release import Release

__all__ = [
    "TOOL_WAITS",
    "Back",
    "LockStep",
    "Pin",
    "Release",
    "ReturnsFirst",
    "ToolWaitPolicy",
    "Turn",
    "make_tool_wait",
]
