"""One registry type for every kind of name a config can hold: losses, schedulers, policies, tasks.

    CONSUMPTION = Registry("consumption policy")

    @CONSUMPTION.register("partial")
    class Partial:
        @dataclass(frozen=True)
        class Args:
            overprovision: float = 1.0  # samples in flight per update, x a step's samples

            def __post_init__(self) -> None:
                check_arg(self.overprovision >= 1, "overprovision", self.overprovision, ">= 1")

        def __init__(self, budget: int, args: Args = Args()) -> None: ...

    policy = CONSUMPTION.build("partial", {"overprovision": 2}, budget)   # Partial(budget, Partial.Args(2.0))

A name is registered once. A name with a colon (`pkg.module:Class`) is imported instead, so every
kind takes a user's class without registering it. A class declares its arguments as a dataclass
`Args` (none: it takes no arguments); `check` turns a mapping into that dataclass and `build` hands it
to the constructor after the context the kind passes (a budget, a data context). Every failure is a
`ValueError` that names the kind, the entry, the argument and the bad value; an unknown name lists
the valid ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from schedrl.config import ConfigError, build_dataclass
from schedrl.dotted import load_object

T = TypeVar("T")
E = TypeVar("E")


def check_arg(ok: bool, field: str, value: Any, must: str) -> None:
    """In an `Args.__post_init__`: `ValueError` "argument 'field' must be <must>, got <value>" unless `ok`."""
    if not ok:
        raise ValueError(f"argument '{field}' must be {must}, got {value!r}")


def args_type(obj: Any) -> type | None:
    """The `Args` dataclass `obj` (a class or factory) declares, or None when it takes no arguments."""
    args = getattr(obj, "Args", None)
    return args if isinstance(args, type) and dataclasses.is_dataclass(args) else None


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


class Registry(Generic[T]):
    """Names -> objects of one kind (functions or classes), each with a one-line description."""

    def __init__(self, kind: str, listing: str = "valid") -> None:
        """`kind` names one entry in messages ("unknown task 'x'"); `listing` heads the valid names."""
        self.kind, self.listing = kind, listing
        self._entries: dict[str, tuple[T, str]] = {}
        self._lazy: dict[str, str] = {}  # name -> "pkg.module:Name", imported on first use

    def register(self, name: str, description: str = "") -> Callable[[E], E]:
        """Decorator storing its target under `name`; the description defaults to its docstring's first line.
        The target keeps its own type (a decorated class stays that class to the type checker)."""

        def wrap(obj: E) -> E:
            self.add(name, obj, description)  # type: ignore[arg-type]
            return obj

        return wrap

    def add_lazy(self, name: str, path: str) -> None:
        """Register the object at `path` (`pkg.module:Name`) as `name` without importing it: a package
        that must not import another (core and a satellite) can still name its entries."""
        if name in self._entries or name in self._lazy:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._lazy[name] = path

    def _load(self, name: str) -> None:
        obj = load_object(self._lazy[name], self.kind)  # a path that does not import stays, and fails again
        del self._lazy[name]
        self.add(name, obj)  # type: ignore[arg-type]

    def add(self, name: str, obj: T, description: str = "") -> None:
        if name in self._entries:
            held = self._entries[name][0]
            raise ValueError(
                f"{self.kind} {name!r} is already registered (by {getattr(held, '__qualname__', held)})"
            )
        if ":" in name:
            raise ValueError(
                f"{self.kind} {name!r}: a registered name holds no ':' (that marks a dotted path)"
            )
        doc = description or (getattr(obj, "__doc__", None) or "").strip().split("\n")[0]
        self._entries[name] = (obj, doc)

    def get(self, name: str) -> T:
        """The object registered as `name`, or imported from `pkg.module:Name`; `ValueError` listing the
        valid names (or naming the path that does not import) otherwise."""
        if isinstance(name, str) and ":" in name:
            return load_object(name, self.kind)  # type: ignore[return-value]
        if name in self._lazy:
            self._load(name)
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; {self.listing}: {', '.join(self.names())}")
        return self._entries[name][0]

    def check(self, name: str, args: Mapping[str, Any] | Any = None) -> Any:
        """The entry's `Args` built from `args` (a mapping, an `Args` already, or None for the defaults);
        None for an entry without arguments. Nothing is constructed: checking a config loads nothing."""
        cls = args_type(self.get(name))
        if cls is None:
            if args:
                given = ", ".join(sorted(args)) if isinstance(args, Mapping) else repr(args)
                raise ValueError(f"{self.kind} {name!r} takes no arguments, got {given}")
            return None
        if isinstance(args, cls):
            return args
        if args is not None and not isinstance(args, Mapping):
            raise ValueError(f"{self.kind} {name!r}: arguments must be a mapping, got {args!r}")
        missing = [
            f.name for f in dataclasses.fields(cls) if f.init and _required(f) and f.name not in (args or {})
        ]
        if missing:
            raise ValueError(f"{self.kind} {name!r}: argument '{missing[0]}' is required (it has no default)")
        try:
            return build_dataclass(cls, dict(args or {}), noun="argument")
        except (ConfigError, ValueError, TypeError) as err:
            raise ValueError(f"{self.kind} {name!r}: {err}") from None

    def build(self, name: str, args: Mapping[str, Any] | Any = None, *context: Any) -> Any:
        """The entry called with `context` and then its checked `Args` (when it declares them)."""
        checked = self.check(name, args)
        obj: Any = self.get(name)
        return obj(*context) if checked is None else obj(*context, checked)

    def names(self) -> list[str]:
        return sorted([*self._entries, *self._lazy])

    def available(self) -> dict[str, str]:
        """`{name: description}`, sorted by name (lazy entries are imported for their docstrings)."""
        for name in list(self._lazy):
            self._load(name)
        return {name: self._entries[name][1] for name in self.names()}

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._lazy or (isinstance(name, str) and ":" in name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries) + len(self._lazy)
