"""The loss a run trains and the keywords every call of it gets, from the config's `algo:` section.

``algo.loss`` names the loss (registered, or ``pkg.module:name`` naming a `Loss`) and
``algo.loss_args`` its arguments, checked by the loss's own `Args`; ``algo.correction`` swaps in an
off-policy correction, which reads the corrected loss's arguments (its clip range) and ``algo.is_cap``.
The other run-wide settings reach a loss by what its spec takes: ``kl_coef`` and ``kl_estimator`` with
the reference's log-probs, ``agg`` (``algo.loss_agg``) with norm "agg".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from schedrl.algos.offpolicy import CORRECTIONS, correctable_losses
from schedrl.algos.registry import LOSSES, available, resolve
from schedrl.algos.spec import CORRECTION_KEYWORDS, KL_KEYWORDS, LossSpec

if TYPE_CHECKING:
    from schedrl.config import AlgoConfig


@dataclass(frozen=True)
class LossCall:
    """What the learner calls: the loss and the keywords of every call besides the batch's tensors."""

    name: str  # the registered loss trained: algo.loss, or the correction replacing its surrogate
    fn: Callable[..., Any]
    spec: LossSpec
    args: Any  # algo.loss_args checked by algo.loss's Args (None: it takes none)
    kwargs: dict[str, Any] = field(default_factory=dict)
    advantage_kwargs: dict[str, Any] = field(default_factory=dict)  # token_advantages' (input "returns")


def loss_name(algo: AlgoConfig) -> str:
    """The loss a run trains with: `algo.loss`, or the off-policy correction replacing its surrogate."""
    return CORRECTIONS[algo.correction] if algo.correction != "none" else algo.loss


def cannot_drive(name: str, algo: AlgoConfig) -> str | None:
    """Why the learner cannot train `algo.loss` = `name` under `algo`, or None when it can."""
    spec = resolve(name).spec
    if spec.correction:
        return "it is an off-policy correction; set algo.correction with algo.loss one of " + ", ".join(
            correctable_losses()
        )
    if algo.kl_coef > 0 and "ref_logp" not in spec.inputs:
        return f"it takes no ref_logp, so algo.kl_coef={algo.kl_coef} cannot apply"
    if algo.loss_agg != "token_mean" and spec.norm != "agg":
        return f"it does not take agg, so algo.loss_agg={algo.loss_agg!r} cannot apply"
    return None


def learner_losses(algo: AlgoConfig) -> list[str]:
    """Registered losses the learner can drive under `algo`."""
    return [n for n in available("loss") if cannot_drive(n, algo) is None]


def loss_call(algo: AlgoConfig) -> LossCall:
    """The loss `algo` trains and its keywords; a `ValueError` naming the loss, the argument and the value
    when `algo.loss_args` does not fit the loss, or the loss cannot run under the rest of `algo`."""
    why = cannot_drive(algo.loss, algo)
    if why:
        raise ValueError(
            f"algo.loss={algo.loss!r}: the learner cannot drive this loss: {why}; "
            f"pick one of: {', '.join(learner_losses(algo))}"
        )
    args = LOSSES.check(algo.loss, algo.loss_args)
    if algo.correction != "none" and algo.loss not in correctable_losses():
        raise ValueError(
            f"algo.correction={algo.correction!r} replaces the PPO-clip surrogate of algo.loss, "
            f"which must be one of {', '.join(correctable_losses())}; got algo.loss={algo.loss!r}"
        )
    name = loss_name(algo)
    loss = resolve(name)
    try:
        kwargs, advantage_kwargs = loss.spec.bind(args)
    except ValueError as err:
        raise ValueError(f"algo.correction={algo.correction!r} reads algo.loss's arguments: {err}") from None
    if "ref_logp" in loss.spec.inputs:
        kwargs |= {k: getattr(algo, k) for k in KL_KEYWORDS}
    if loss.spec.correction:
        kwargs |= {k: getattr(algo, k) for k in CORRECTION_KEYWORDS}
    if loss.spec.norm == "agg":
        kwargs["agg"] = algo.loss_agg
    return LossCall(name, loss.fn, loss.spec, args, kwargs, advantage_kwargs)
