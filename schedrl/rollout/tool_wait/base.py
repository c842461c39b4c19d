"""What happens to a trajectory while it waits on a tool or an environment (`schedule.tool_wait`).

When a model turn ends and the environment starts working on it, the trajectory waits. Every
peer frees its engine slot and prefills the whole history again when the answer comes back
(`release`); TRL's tool loop waits for the slowest call of the batch (`lockstep`). A
`ToolWaitPolicy` decides, per trajectory:

    keep_s(turn)    before the turn runs: for how many seconds its keys and values stay in the
                    engine after it ends (0: release). The engine parks the slot; the next turn
                    prefills only the appended tokens if it comes back in time and no admission
                    needed the slot meanwhile.
    priority(back)  when the environment answers: the admission priority of the next turn
                    (fresh trajectories have 0; a priority-aware admission policy runs higher first).
    observe(back)   every answer, with how long it took: the policy's latency estimate learns.
    lockstep        hold every answer until the whole batch has answered (the baseline of TRL).
    parks           whether `keep_s` can be > 0 (the engine must then be a `ParkingEngine`); a class
                    attribute, so a config can be checked without building the policy.
    orders_returns  whether `priority(back)` can be non-zero: the policy then acts through admission
                    priorities, which only a priority-aware admission policy reads (`fcfs` ignores
                    them). It may depend on the policy's arguments (`pin` with or without `priority`),
                    so read it from a built policy.

Each policy declares its arguments (`schedule.tool_wait_args`) as a dataclass `Args`; `TOOL_WAITS.build`
checks them and builds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from schedrl.registry import Registry


@dataclass(frozen=True)
class Turn:
    """A model turn about to be admitted."""

    episode: str
    turn: int  # 0-based model turn
    max_turns: int
    history_tokens: int  # its prompt: what a re-prefill after the wait would compute again
    # the longest of the engine's recent steps: how late an answer that is back can be handed on (a step
    # in progress finishes first), so a time to live that covers the tool covers this too
    step_s: float = 0.0


@dataclass(frozen=True)
class Back:
    """An environment's answer to a turn, about to start the next one."""

    episode: str
    turn: int  # the next model turn (0-based)
    max_turns: int
    history_tokens: int
    wait_s: float  # from the turn's end to the answer
    statuses: tuple[str, ...] = ()  # tool-call outcomes of the answer ("ok", "error", "timeout", ...)
    model_tokens: int = 0  # tokens the trajectory has generated so far


@runtime_checkable
class ToolWaitPolicy(Protocol):
    """What a trajectory holds while its tool runs (the module's docstring gives each method's rule).
    Promises: `parks` is True if `keep_s` can be > 0, `orders_returns` if `priority` can be non-zero,
    `lockstep` if answers are held until the whole batch has answered."""

    lockstep: bool
    parks: bool
    orders_returns: bool

    def keep_s(self, turn: Turn) -> float: ...

    def priority(self, back: Back) -> float: ...

    def observe(self, back: Back) -> None: ...


TOOL_WAITS: Registry[type] = Registry("tool-wait policy")


def make_tool_wait(name: str, **args: Any) -> ToolWaitPolicy:
    """The policy registered as `name` (or `pkg.module:Class`), built from its arguments."""
    return TOOL_WAITS.build(name, args)
