"""Registry of advantage estimators and losses: pick a variant by name, never by a ``loss_type`` flag.

    @register("loss", "grpo", "PPO-clip surrogate plus optional KL", LossSpec(inputs=frozenset({"ref_logp"})))
    def grpo_loss(logp, old_logp, adv, mask, **kw): ...

    loss_fn = get("loss", "grpo")
    needs = loss_spec("grpo").inputs
    args = LOSSES.check("grpo", {"clip_eps_high": 0.28})   # its Args: ClipArgs(0.2, 0.28)

Every loss shares the signature ``(logp, old_logp, adv, mask, **kw) -> (loss, stats)`` and is
registered with the `LossSpec` of what it needs (its `Args` included); every advantage estimator
takes ``(rewards, group_index, **kw) -> adv``. A loss name may also be ``pkg.module:name``, naming a
`Loss` record there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from schedrl.algos.spec import Loss, LossSpec
from schedrl.registry import Registry

F = TypeVar("F", bound=Callable[..., Any])

KINDS: tuple[str, ...] = ("advantage", "loss")
ADVANTAGES: Registry[Callable[..., Any]] = Registry("advantage")
LOSSES: Registry[Loss] = Registry("loss")


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; valid: {', '.join(KINDS)}")


def register(kind: str, name: str, description: str, spec: LossSpec | None = None) -> Callable[[F], F]:
    """Decorator storing a function under ``(kind, name)``; a loss comes with its spec."""
    _check_kind(kind)
    if (kind == "loss") != (spec is not None):
        raise ValueError(f"{kind} {name!r}: a loss is registered with a LossSpec, an advantage without one")

    def wrap(fn: F) -> F:
        if spec is not None:
            LOSSES.add(name, Loss(fn, spec), description)
        else:
            ADVANTAGES.add(name, fn, description)
        return fn

    return wrap


def get(kind: str, name: str) -> Callable[..., Any]:
    """The function registered as ``name``; ``ValueError`` listing the valid names otherwise."""
    _check_kind(kind)
    return resolve(name).fn if kind == "loss" else ADVANTAGES.get(name)


def resolve(name: str) -> Loss:
    """The loss registered as ``name``, or the `Loss` record at ``pkg.module:name``."""
    obj = LOSSES.get(name)
    if not isinstance(obj, Loss):
        raise ValueError(
            f"loss {name!r}: a dotted path must name a schedrl.algos.spec.Loss (the function with its "
            f"LossSpec), got {type(obj).__name__}"
        )
    return obj


def loss_spec(name: str) -> LossSpec:
    """The spec of the loss registered as ``name`` (or at ``pkg.module:name``)."""
    return resolve(name).spec


def available(kind: str) -> dict[str, str]:
    """``{name: description}`` of everything registered under ``kind``."""
    _check_kind(kind)
    return (LOSSES if kind == "loss" else ADVANTAGES).available()
