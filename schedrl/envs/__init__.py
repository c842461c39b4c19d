"""Verifiable tasks: generated arithmetic/digit problems, a long-tailed mixture and user files."""

from schedrl.envs.addition import AdditionTask
from schedrl.envs.base import Task, TaskSource, exact_match, split_of
from schedrl.envs.countdown import CountdownTask
from schedrl.envs.digits import ReverseDigitsTask, SortDigitsTask
from schedrl.envs.longtail import LongtailMix
from schedrl.envs.registry import TASKS, make_task
from schedrl.envs.user import FileTask

__all__ = [
    "TASKS",
    "AdditionTask",
    "CountdownTask",
    "FileTask",
    "LongtailMix",
    "ReverseDigitsTask",
    "SortDigitsTask",
    "Task",
    "TaskSource",
    "exact_match",
    "make_task",
    "split_of",
]
