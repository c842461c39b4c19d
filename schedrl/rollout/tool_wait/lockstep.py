"""`lockstep`: every trajectory of a batch waits for the slowest answer of its turn (TRL's tool loop).

A baseline: the next turns start together once every environment of the batch has answered.
"""

from __future__ import annotations

from schedrl.rollout.tool_wait.base import TOOL_WAITS
from schedrl.rollout.tool_wait.release import Release


@TOOL_WAITS.register("lockstep")
class LockStep(Release):
    """the batch waits for its slowest tool before the next turn (TRL's loop; a baseline)"""

    lockstep = True
