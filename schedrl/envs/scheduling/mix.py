"""The scheduling text tasks as a tiered mix for the data schedulers (`sched_tiered`).

Tiers for the offline tiny model at an 8-token budget, as `tiered` has them for its digit tasks:

- tier 0: `activity_pair`, two activities (is one inside the other's gap?), learned in SFT;
- tier 1 (learnable by RL): `activity`, 3-4 activities; `lis`, increasing subsequences of 4-5 digits;
- tier 2 (out of reach): `lis_long`, 10-12 digits; `rcpsp`, start times for a 4-activity project
  under precedence and disjunctive constraints; `rcpsp_long` (weight 0 unless `weights` name it),
  an 8-activity project whose answers, about 20 tokens, make every failure long.

Rewards are each task's own (`gap`: partial credit for a feasible, shorter answer; `rcpsp`: 1
for a feasible schedule).
"""

from __future__ import annotations

from schedrl.envs.base import GeneratedTasks
from schedrl.envs.scheduling.activity import ActivityTask
from schedrl.envs.scheduling.lis import LISTask
from schedrl.envs.scheduling.rcpsp import RCPSPTask
from schedrl.envs.tiered import TieredMix

SCHEDULE_DOMAINS: dict[str, tuple[int, GeneratedTasks]] = {
    "activity_pair": (0, ActivityTask(2, 2)),
    "activity": (1, ActivityTask(3, 4)),
    "lis": (1, LISTask(4, 5)),
    "lis_long": (2, LISTask(10, 12)),
    "rcpsp": (2, RCPSPTask(levels=2, width=2, precedences=2, disjunctive=1)),
    # out of reach with long answers (8 start times, about 20 tokens): left out of the default mix
    "rcpsp_long": (2, RCPSPTask(levels=4, width=2, precedences=2, disjunctive=1)),
}
SCHEDULE_WEIGHTS = {"activity_pair": 0.2, "activity": 0.2, "lis": 0.2, "lis_long": 0.2, "rcpsp": 0.2}


class ScheduleMix(TieredMix):
    """Sample a scheduling domain by weight, then a task from it; `difficulty` is its tier."""

    name = "sched_tiered"
    domains = SCHEDULE_DOMAINS
    default_weights = SCHEDULE_WEIGHTS
