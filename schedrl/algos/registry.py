"""Registry of advantage estimators and losses: pick a variant by name, never by a ``loss_type`` flag.

    @register("loss", "grpo", "PPO-clip surrogate plus optional KL to a reference policy")
    def grpo_loss(logp, old_logp, adv, mask, **kw): ...

    loss_fn = get("loss", "grpo")

Every loss shares the signature ``(logp, old_logp, adv, mask, **kw) -> (loss, stats)``; every
advantage estimator takes ``(rewards, group_index, **kw) -> adv``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

KINDS: tuple[str, ...] = ("advantage", "loss")
_REGISTRY: dict[str, dict[str, tuple[Callable[..., Any], str]]] = {kind: {} for kind in KINDS}


def _table(kind: str) -> dict[str, tuple[Callable[..., Any], str]]:
    if kind not in _REGISTRY:
        raise ValueError(f"unknown kind {kind!r}; valid: {', '.join(KINDS)}")
    return _REGISTRY[kind]


def register(kind: str, name: str, description: str) -> Callable[[F], F]:
    """Decorator storing a function under ``(kind, name)``; a name may be registered only once."""
    table = _table(kind)

    def wrap(fn: F) -> F:
        if name in table:
            raise ValueError(f"{kind} {name!r} is already registered (by {table[name][0].__qualname__})")
        table[name] = (fn, description)
        return fn

    return wrap


def get(kind: str, name: str) -> Callable[..., Any]:
    """The function registered as ``name``; ``ValueError`` listing the valid names otherwise."""
    table = _table(kind)
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; valid: {', '.join(sorted(table))}")
    return table[name][0]


def available(kind: str) -> dict[str, str]:
    """``{name: description}`` of everything registered under ``kind``."""
    return {name: desc for name, (_, desc) in sorted(_table(kind).items())}
