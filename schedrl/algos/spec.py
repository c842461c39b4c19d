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
* `args` -- the loss's own `Args` dataclass: ``algo.loss_args`` checked by it, each field passed by
  keyword under its name (those `advantage_options` names go to `token_advantages` instead). Losses
  with the same arguments share one `Args`. Run-wide settings come by what the loss takes:
  ``kl_coef`` and ``kl_estimator`` with ``ref_logp``, ``is_cap`` (``algo.is_cap``) with a correction;
* `correction` / `correctable` -- an off-policy correction (chosen by ``algo.correction``,
  never by ``algo.loss``; it reads the corrected loss's arguments), and the losses whose PPO-clip
  surrogate a correction may replace.
"""

from __future__ import annotations

import dataclasses
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
# The run-wide `algo:` settings a loss with the reference's log-probs, or a correction, is called with.
KL_KEYWORDS = ("kl_coef", "kl_estimator")
CORRECTION_KEYWORDS = ("is_cap",)


@dataclass(frozen=True)
class LossSpec:
    inputs: frozenset[str] = frozenset()
    norm: Literal["agg", "sequence", "constant"] = "agg"
    args: type | None = None  # the loss's Args (a frozen dataclass); None: it takes no arguments
    correction: bool = False
    correctable: bool = False
    # with input "returns": (adv (B,), old_values (B, T), mask (B, T), **advantage_options)
    # -> (token advantages (B, T), returns (B, T))
    token_advantages: Callable[..., Any] | None = None
    advantage_options: tuple[str, ...] = ()  # the fields of `args` token_advantages reads (not the loss)
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
        if self.args is not None and not (
            isinstance(self.args, type)
            and dataclasses.is_dataclass(self.args)
            and self.args.__dataclass_params__.frozen  # type: ignore[attr-defined]
        ):
            raise ValueError(f"LossSpec.args must be a frozen dataclass, got {self.args!r}")
        stray = sorted(set(self.advantage_options) - set(self.arg_names()))
        if stray:
            raise ValueError(f"LossSpec.advantage_options: {stray} are not fields of args")

    def arg_names(self) -> tuple[str, ...]:
        """The fields of the loss's `Args`."""
        return tuple(f.name for f in dataclasses.fields(self.args)) if self.args is not None else ()

    def bind(self, args: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Checked arguments as keywords: (the loss's, token_advantages'). `args` is an instance of this
        spec's `Args`, or, for a correction, of the corrected loss's, which must carry every field."""
        names = self.arg_names()
        missing = [n for n in names if not hasattr(args, n)]
        if missing:
            raise ValueError(f"the arguments {type(args).__name__} lack {', '.join(missing)}")
        loss = {n: getattr(args, n) for n in names}
        return loss, {n: loss.pop(n) for n in self.advantage_options}

    def keywords(self) -> set[str]:
        """Every keyword the learner passes to the loss under this spec."""
        out = {kw for name in self.inputs for kw in KEYWORDS[name]}
        out |= set(self.arg_names()) - set(self.advantage_options)
        if "ref_logp" in self.inputs:
            out |= set(KL_KEYWORDS)
        if self.correction:
            out |= set(CORRECTION_KEYWORDS)
        if self.norm == "agg":
            out.add("agg")
        if self.norm == "constant":
            out.add("max_tokens")
        return out


@dataclass(frozen=True)
class Loss:
    """A loss: the pure function and its spec. Registered by `register`, or named by ``algo.loss:
    pkg.module:name`` (then ``name = Loss(fn, LossSpec(...))`` in that module); calling it calls `fn`."""

    fn: Callable[..., Any]
    spec: LossSpec

    @property
    def Args(self) -> type | None:
        """The loss's arguments (`Registry.check` builds them from ``algo.loss_args``); None: none."""
        return self.spec.args

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)
