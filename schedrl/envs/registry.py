"""Task registry: ``make_task("addition", max_digits=3)`` builds a ``TaskSource`` by name."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from schedrl.dotted import load_object
from schedrl.envs.addition import AdditionTask
from schedrl.envs.base import TaskSource
from schedrl.envs.calc import CalcTask
from schedrl.envs.calendar import CalendarEnv, CalendarTask
from schedrl.envs.code_task import LinearCodeTask
from schedrl.envs.countdown import CountdownTask
from schedrl.envs.digits import ReverseDigitsTask, SortDigitsTask
from schedrl.envs.environment import Environment, SingleTurnEnv, build_environment
from schedrl.envs.experiments import ExperimentsEnv, ExperimentsTask
from schedrl.envs.forecast import ForecastTask
from schedrl.envs.guess import GuessEnv, GuessTask
from schedrl.envs.gym_adapter import GymEnv, GymTasks
from schedrl.envs.longtail import LongtailMix
from schedrl.envs.lookup import LookupEnv, LookupTask
from schedrl.envs.math_words import MathWordTask
from schedrl.envs.recall import RecallEnv, RecallTask
from schedrl.envs.search_qa import SearchQA
from schedrl.envs.swe_repair import SWERepairTask
from schedrl.envs.text_to_sql import TextToSQLTask
from schedrl.envs.tiered import TieredMix
from schedrl.envs.tool_env import tool_env
from schedrl.envs.tool_plan import ToolPlanTask
from schedrl.envs.user import FileTask
from schedrl.registry import Registry

TASKS: Registry[Callable[..., TaskSource]] = Registry("task", "valid tasks")
for _name, _factory in (
    ("addition", AdditionTask),
    ("sort", SortDigitsTask),
    ("reverse", ReverseDigitsTask),
    ("countdown", CountdownTask),
    ("longtail", LongtailMix),
    ("tiered", TieredMix),
    ("file", FileTask),
    ("calc", CalcTask),
    ("guess", GuessTask),
    ("linear_code", LinearCodeTask),
    ("math_words", MathWordTask),
    ("gym", GymTasks),
    ("text_to_sql", TextToSQLTask),
    ("swe_repair", SWERepairTask),
    ("forecast", ForecastTask),
    ("search_qa", SearchQA),
    ("tool_plan", ToolPlanTask),
    ("calendar", CalendarTask),
    ("recall", RecallTask),
    ("lookup", LookupTask),
    ("experiments", ExperimentsTask),
):
    TASKS.add(_name, _factory)
# the scheduling problems live in a satellite package (`envs/scheduling/`), named here, imported on use
for _name, _path in (
    ("activity", "schedrl.envs.scheduling.activity:ActivityTask"),
    ("lis", "schedrl.envs.scheduling.lis:LISTask"),
    ("jssp_text", "schedrl.envs.scheduling.jssp_text:JobShopTextTask"),
    ("rcpsp", "schedrl.envs.scheduling.rcpsp:RCPSPTask"),
    ("sched_tiered", "schedrl.envs.scheduling.mix:ScheduleMix"),
):
    TASKS.add_lazy(_name, _path)
TASKS.add_lazy("openenv", "schedrl.envs.openenv.adapter:OpenEnvTasks")  # needs schedrl[openenv]
TASKS.add_lazy("verifiers", "schedrl.envs.verifiers_adapter:verifiers_tasks")  # needs schedrl[verifiers]

# How a task's episodes run: `single_turn` (the prompt, one completion, the task's reward) or `tools`
# (turns that call tools until one answers); each takes the task source first.
ENVIRONMENTS: Registry[Callable[..., Environment]] = Registry("environment")
ENVIRONMENTS.add("single_turn", SingleTurnEnv, "the prompt, one completion, the task's reward")
ENVIRONMENTS.add("tools", tool_env, "turns that call tools (env_args.tools) until one answers")
ENVIRONMENTS.add("guess", GuessEnv, "the higher/lower game of the guess task: a guess per turn")
ENVIRONMENTS.add(
    "calendar", CalendarEnv, "the calendar task's rounds: a booking per turn, a reward per round"
)
ENVIRONMENTS.add("recall", RecallEnv, "the recall task's rounds: the register's value each turn")
ENVIRONMENTS.add("lookup", LookupEnv, "the lookup task: a sub-agent reads each key's document")
ENVIRONMENTS.add("experiments", ExperimentsEnv, "the experiments task: the picked method runs for its time")
ENVIRONMENTS.add("gym", GymEnv, "a Gymnasium text environment (task gym: its id and reset seeds)")
ENVIRONMENTS.add_lazy("verifiers", "schedrl.envs.verifiers_adapter:VerifiersEnv")
ENVIRONMENTS.add_lazy("openenv", "schedrl.envs.openenv.adapter:OpenEnvEnv")
ENVIRONMENTS.add_lazy("repair", "schedrl.envs.scheduling.repair:RepairEnv")


def make_env(name: str, source: TaskSource, **kwargs: Any) -> Environment:
    """The environment registered as `name`, or a dotted path to a class or factory, built on `source`."""
    factory = ENVIRONMENTS.get(name) if ":" not in name else load_object(name, "environment")
    return build_environment(name, factory, source, **kwargs)


def make_task(name: str, **kwargs: Any) -> TaskSource:
    """Build the task registered as ``name``; ``ValueError`` for an unknown name or bad arguments."""
    factory = TASKS.get(name)
    params = inspect.signature(factory).parameters
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise ValueError(
            f"task {name!r}: unknown argument {unknown[0]!r}; valid arguments: {', '.join(params) or 'none'}"
        )
    missing = [p for p, spec in params.items() if spec.default is inspect.Parameter.empty and p not in kwargs]
    if missing:
        raise ValueError(f"task {name!r}: missing required argument {missing[0]!r}")
    return factory(**kwargs)
