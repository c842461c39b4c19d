"""One registry type for every kind of name a config can hold: losses, schedulers, policies, tasks.

    WEIGHT_SYNC = Registry("weight-sync policy")

    @WEIGHT_SYNC.register("inflight", "new weights reach the engines between decode steps")
    class Inflight: ...

    policy = WEIGHT_SYNC.get("inflight")()

A name is registered once; an unknown name is a `ValueError` that lists the valid ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Names -> objects of one kind (functions or classes), each with a one-line description."""

    def __init__(self, kind: str, listing: str = "valid") -> None:
        """`kind` names one entry in messages ("unknown task 'x'"); `listing` heads the valid names."""
        self.kind, self.listing = kind, listing
        self._entries: dict[str, tuple[T, str]] = {}

    def register(self, name: str, description: str = "") -> Callable[[T], T]:
        """Decorator storing its target under `name`; the description defaults to its docstring's first line."""

        def wrap(obj: T) -> T:
            self.add(name, obj, description)
            return obj

        return wrap

    def add(self, name: str, obj: T, description: str = "") -> None:
        if name in self._entries:
            held = self._entries[name][0]
            raise ValueError(
                f"{self.kind} {name!r} is already registered (by {getattr(held, '__qualname__', held)})"
            )
        doc = description or (getattr(obj, "__doc__", None) or "").strip().split("\n")[0]
        self._entries[name] = (obj, doc)

    def get(self, name: str) -> T:
        """The object registered as `name`; `ValueError` listing the valid names otherwise."""
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; {self.listing}: {', '.join(self.names())}")
        return self._entries[name][0]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def available(self) -> dict[str, str]:
        """`{name: description}`, sorted by name."""
        return {name: self._entries[name][1] for name in self.names()}

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)
