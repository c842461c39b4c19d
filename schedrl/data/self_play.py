"""Self-play (search self-play): the solver trains on questions the policy itself proposed.

Each batch is part propose tasks, drawn from the source (`source.propose(split, n, seed)`), and part
solve tasks from a bank of the questions earlier proposals made: when a propose group is observed, every
completion the source verifies (`source.proposal(task, completion)` gives its solve task, or None) joins
the bank, newest kept when it is full. The solve share of a batch is `solve_share`, as far as the bank
holds questions (it starts empty, so the first batches are all proposals). With `balance` the bank's
question kinds (`Task.metadata["kind"]`) take turns: a proposer that settles on one kind of question
(as the tiny model's does, on the city of a record) would otherwise train the solver on that kind alone. The bank is part of the
scheduler's state, so a resumed run goes on with it. The source must be one with both roles, as
`search_qa` is.

References: Lu et al., "Search Self-play: Pushing the Frontier of Agent Capability without Supervision"
(2025).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from schedrl.data.base import Batch, DataContext, ScoredGroup, check_batch, check_budget
from schedrl.envs import Task
from schedrl.registry import check_arg
from schedrl.seeding import derive_seed


class SelfPlayScheduler:
    """Propose tasks from the source; solve tasks from the verified questions the proposals made."""

    name = "self_play"

    @dataclass(frozen=True)
    class Args:
        solve_share: float = 0.5  # of a batch's tasks, solved from the bank (as far as it holds them)
        bank_size: int = 2000  # verified questions kept, newest first
        balance: bool = True  # draw the bank's question kinds (`metadata["kind"]`) in turn

        def __post_init__(self) -> None:
            check_arg(0.0 < self.solve_share < 1.0, "solve_share", self.solve_share, "in (0, 1)")
            check_arg(self.bank_size >= 1, "bank_size", self.bank_size, ">= 1")

    def __init__(self, ctx: DataContext, args: Args = Args()) -> None:
        for method in ("propose", "proposal", "solve_task"):
            if not callable(getattr(ctx.source, method, None)):
                raise ValueError(
                    f"data scheduler 'self_play' needs a task with proposer and solver roles (as "
                    f"search_qa), and {type(ctx.source).__name__} has no {method}()"
                )
        self.ctx, self.args = ctx, args
        self.position = 0
        self.bank: list[Task] = []
        self.proposed = self.verified = 0

    def next_batch(self, budget: int) -> Batch:
        g = self.ctx.group_size
        check_budget(self.name, budget, g)
        n = budget // g
        rng = random.Random(derive_seed(self.ctx.seed, "data", self.position))
        solve = min(len(self.bank), round(self.args.solve_share * n))
        tasks = self._draw(rng, solve)
        source: Any = self.ctx.source
        tasks += source.propose("train", n - solve, derive_seed(self.ctx.seed, "propose", self.position))
        self.position += 1
        return check_batch(self.name, [(t, g) for t in tasks], budget)

    def _draw(self, rng: random.Random, n: int) -> list[Task]:
        """`n` banked questions, without replacement; balanced: the kinds in turn (a kind with few
        questions gives what it has), so a proposer that keeps to one kind does not starve the others."""
        if not self.args.balance:
            return rng.sample(self.bank, n)
        kinds: dict[str, list[Task]] = {}
        for t in self.bank:
            kinds.setdefault(str(t.metadata.get("kind", t.domain)), []).append(t)
        pools = [rng.sample(ts, len(ts)) for _, ts in sorted(kinds.items())]
        out: list[Task] = []
        while len(out) < n:
            for pool in pools:
                if pool and len(out) < n:
                    out.append(pool.pop())
        return out

    def observe(self, groups: Sequence[ScoredGroup]) -> None:
        source: Any = self.ctx.source
        known = {t.id for t in self.bank}
        for group in groups:
            if group.task.domain != "propose":
                continue
            for text in group.texts:
                self.proposed += 1
                made = source.proposal(group.task, text)
                if made is not None:
                    self.verified += 1
                    if made.id not in known:
                        known.add(made.id)
                        self.bank.append(made)
        del self.bank[: max(0, len(self.bank) - self.args.bank_size)]

    def metrics(self) -> dict[str, float]:
        return {
            "selfplay/bank": float(len(self.bank)),
            "selfplay/verified_frac": self.verified / max(1, self.proposed),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "bank": [asdict(t) for t in self.bank],
            "proposed": self.proposed,
            "verified": self.verified,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])
        self.bank = [Task(**t) for t in state["bank"]]
        self.proposed, self.verified = int(state["proposed"]), int(state["verified"])
