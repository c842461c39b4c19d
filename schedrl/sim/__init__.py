"""A discrete-event simulator of an RL post-training cluster: engines, learners, weight sync, and the
schedules between them (`schedrl simulate`).

- `lengths`: output-length distributions per prompt group (heavy-tailed and capped, or a run's own).
- `costs`: what a decode step, a prefill, a training step and a weight sync cost.
- `engine`: one continuous-batching engine instance, stepped as a fluid between events.
- `cluster`: the RL loop over engines and a learner, under a schedule (sync, async with staleness k,
  partial rollouts, in-flight updates, length-ordered admission).
- `scenario`: the YAML a user writes, validated key by key.
"""

from schedrl.sim.cluster import SimResult, simulate
from schedrl.sim.scenario import Scenario, load_scenario, scenario_from_dict

__all__ = ["Scenario", "SimResult", "load_scenario", "scenario_from_dict", "simulate"]
