"""Rollout modes (`schedule.rollout`): how a step's samples are produced, each with its own `Args`.

    plain        every request runs on the engine from its prompt
    pruning      ARRoL: groups over-provisioned to `sampling.group_size`, each pruned online to `keep`
                 members by a success predictor (`schedrl.rollout.pruning`)
    speculative  SPEC-RL: a task's last rollout drafts its next one, verified by the current policy
                 (`schedrl.rollout.speculative`)

A mode declares what it can run beside: `multi_turn` (episodes with tools or an environment) and
`asynchronous` (the asynchronous pipeline, where a request's weights may change while it runs). A
schedule that asks for more is refused at resolution, naming the mode and the property.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from schedrl.registry import Registry, check_arg


class RolloutMode(Protocol):
    """A way of producing a step's samples. Promises: `multi_turn` and `asynchronous` say truthfully
    whether it can run beside episodes and in the asynchronous pipeline (a schedule asking for more is
    refused, naming the property); `check_run` refuses a run's sampling it cannot serve."""

    multi_turn: bool
    asynchronous: bool

    def check_run(self, group_size: int) -> None: ...


ROLLOUT_MODES: Registry[type] = Registry("rollout mode")


@ROLLOUT_MODES.register("plain")
class Plain:
    """every request runs on the engine from its prompt"""

    multi_turn = True
    asynchronous = True

    def check_run(self, group_size: int) -> None:
        """Nothing to check against the run's sampling."""


@ROLLOUT_MODES.register("pruning")
class Pruning:
    """ARRoL: each over-provisioned group pruned online to `keep` members by a success predictor"""

    multi_turn = False  # it judges single completions by their log-probs
    asynchronous = False  # it drives the engine step by step, in the synchronous loop

    @dataclass(frozen=True)
    class Args:
        keep: int = 4  # samples kept per group (< sampling.group_size, the over-provisioned size)
        success_frac: float = 0.5  # target share of predicted successes among the kept samples
        check_tokens: int = 4  # output tokens every running member needs before its group is judged
        mode: Literal["drop", "keep"] = "drop"  # pruned samples: dropped from the loss, or kept (partial)

        def __post_init__(self) -> None:
            check_arg(self.keep >= 2, "keep", self.keep, ">= 2 (a group baseline needs two samples)")
            check_arg(0 <= self.success_frac <= 1, "success_frac", self.success_frac, "in [0, 1]")
            check_arg(self.check_tokens > 0, "check_tokens", self.check_tokens, "> 0")

    def __init__(self, args: Args = Args()) -> None:
        self.args = args

    def check_run(self, group_size: int) -> None:
        if self.args.keep >= group_size:
            raise ValueError(
                f"rollout mode 'pruning': argument 'keep' must be below sampling.group_size={group_size} "
                f"(the over-provisioned group it prunes), got {self.args.keep!r}"
            )


@ROLLOUT_MODES.register("speculative")
class Speculative:
    """SPEC-RL: a task's last rollout drafts its next one, verified by the current policy"""

    multi_turn = False  # it verifies single completions
    asynchronous = False  # drafts are verified by the weights of the step, in the synchronous loop

    @dataclass(frozen=True)
    class Args:
        draft_versions: int = 4  # a draft at most this many versions older than the policy is used

        def __post_init__(self) -> None:
            check_arg(self.draft_versions > 0, "draft_versions", self.draft_versions, "> 0")

    def __init__(self, args: Args = Args()) -> None:
        self.args = args

    def check_run(self, group_size: int) -> None:
        """Nothing to check against the run's sampling."""
