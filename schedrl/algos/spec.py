"""What a registered loss needs from the learner, and how its micro-batch losses add up.

Every loss is a pure function ``(logp, old_logp, adv, mask, **kw) -> (loss, stats)``; its
`LossSpec` sits beside it in the registry and is the whole contract with the learner:

* `inputs` -- tensors the learner computes and passes by keyword:
  ``ref_logp`` (the frozen reference policy's log-probs, for ``kl_coef``),
  ``behav_logp`` (the behaviour log-probs the engine recorded), ``versions`` (per-token policy
  versions, with ``prox_version`` of the weights being updated), ``values`` (V(s_t) from a
  value head trained with the policy), ``returns`` (with ``old_values``: GAE on the value head
  turns each sequence's reward into token advantages, by `token_advantages`), ``vocab_stat``
  (``mean_logp`` and ``old_mean_logp``: `vocab_stat(logits, temperature)` of the current and
  the pre-update policy), ``groups`` (``group_index``: every sample of a group in one micro-batch);
* `norm` -- how the loss is normalised, which fixes how micro-batch losses combine into the
  minibatch's: ``"agg"`` (it takes ``agg``, the mean ``algo.loss_agg`` names: over tokens or over
  sequences), ``"sequence"`` (a mean over sequences), ``"constant"`` (a token sum divided by
  ``max_tokens`` = rows x the generation budget; micro-batch losses add up);
* `options` -- the `AlgoConfig` fields it reads, passed by keyword under the same names;
* `correction` / `correctable` -- an off-policy correction (chosen by ``algo.correction``,
  never by ``algo.name``), and the losses whose PPO-clip surrogate a correction may replace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

INPUTS = ("ref_logp", "behav_logp", "versions", "values", "returns", "vocab_stat", "groups")
NORMS = ("agg", "sequence", "constant")
# The keywords each input puts into the loss call.
KEYWORDS = {
    "ref_logp": ("ref_logp",),
    "behav_logp": ("behav_logp",),
    "versions": ("versions", "prox_version"),
    "values": ("values",),
    "returns": ("old_values", "returns"),
    "vocab_stat": ("mean_logp", "old_mean_logp"),
    "groups": ("group_index",),
}


@dataclass(frozen=True)
class LossSpec:
    inputs: frozenset[str] = frozenset()
    norm: Literal["agg", "sequence", "constant"] = "agg"
    options: tuple[str, ...] = ()
    correction: bool = False
    correctable: bool = False
    # with input "returns": (adv (B,), old_values (B, T), mask (B, T), **advantage_options)
    # -> (token advantages (B, T), returns (B, T))
    token_advantages: Callable[..., Any] | None = None
    advantage_options: tuple[str, ...] = ()  # the AlgoConfig fields token_advantages reads
    # with input "vocab_stat": (logits (B, T, V), temperature) -> (B, T)
    vocab_stat: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.inputs) - set(INPUTS))
        if unknown:
            raise ValueError(f"LossSpec.inputs: unknown {unknown}; valid: {', '.join(INPUTS)}")
        if self.norm not in NORMS:
            raise ValueError(f"LossSpec.norm must be one of {', '.join(NORMS)}, got {self.norm!r}")
        if ("returns" in self.inputs) != (self.token_advantages is not None):
            raise ValueError("LossSpec: input 'returns' and token_advantages come together")
        if ("vocab_stat" in self.inputs) != (self.vocab_stat is not None):
            raise ValueError("LossSpec: input 'vocab_stat' and vocab_stat come together")
        if "returns" in self.inputs and "values" not in self.inputs:
            raise ValueError("LossSpec: input 'returns' needs 'values' (the value head)")

    def keywords(self) -> set[str]:
        """Every keyword the learner passes to the loss under this spec."""
        out = {kw for name in self.inputs for kw in KEYWORDS[name]} | set(self.options)
        if self.norm == "agg":
            out.add("agg")
        if self.norm == "constant":
            out.add("max_tokens")
        return out


@dataclass(frozen=True)
class Loss:
    """A registered loss: the pure function and its spec."""

    fn: Callable[..., Any]
    spec: LossSpec
