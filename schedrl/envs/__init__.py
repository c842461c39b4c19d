"""Verifiable tasks: generated arithmetic/digit problems, a long-tailed mixture and user files."""

from schedrl.envs.addition import AdditionTask
from schedrl.envs.base import Task, TaskSource, exact_match, split_of
from schedrl.envs.calc import CalcTask
from schedrl.envs.countdown import CountdownTask
from schedrl.envs.digits import ReverseDigitsTask, SortDigitsTask
from schedrl.envs.environment import Environment, Observation, SingleTurnEnv, StepResult
from schedrl.envs.longtail import LongtailMix
from schedrl.envs.registry import ENVIRONMENTS, TASKS, make_env, make_task
from schedrl.envs.user import FileTask

__all__ = [
    "ENVIRONMENTS",
    "TASKS",
    "AdditionTask",
    "CalcTask",
    "Environment",
    "Observation",
    "SingleTurnEnv",
    "StepResult",
    "make_env",
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
