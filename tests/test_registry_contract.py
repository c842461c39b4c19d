"""The contract every named policy keeps (`schedrl.registry`): its arguments are a frozen `Args`
dataclass, each field documented on its line and given a default (or said to be required), and
`check(name, {})` gives the defaults without building anything, or names the missing argument."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

from schedrl.algos.registry import LOSSES
from schedrl.data import SCHEDULERS
from schedrl.orchestrate.schedule import POLICIES
from schedrl.registry import Registry, args_type
from schedrl.rollout.registry import PREDICTORS

REGISTRIES: dict[str, Registry] = {**POLICIES, "predictor": PREDICTORS, "loss": LOSSES}


def documented_fields(args_cls: type) -> dict[str, str]:
    """Each field of `args_cls` -> the `# comment` on its line, from the class that declares it."""
    out: dict[str, str] = {}
    for klass in reversed(args_cls.__mro__[:-1]):
        for line in inspect.getsource(klass).splitlines():
            m = re.match(r"\s*(\w+): [^#=]+(?:=[^#]+)?#\s*(.+)", line)
            if m and m.group(1) in vars(klass).get("__annotations__", {}):
                out[m.group(1)] = m.group(2)
    return out


@pytest.mark.parametrize(("kind", "name"), [(k, n) for k, r in REGISTRIES.items() for n in r.names()])
def test_every_entry_declares_checked_documented_args(kind, name):
    registry = REGISTRIES[kind]
    args = args_type(registry.get(name))
    if args is None:
        assert registry.check(name, {}) is None
        with pytest.raises(ValueError, match=rf"'{name}' takes no arguments, got surplus"):
            registry.check(name, {"surplus": 1})
        return
    assert args.__dataclass_params__.frozen, name  # type: ignore[attr-defined]
    notes = documented_fields(args)
    required = []
    for f in dataclasses.fields(args):
        assert f.name in notes, f"{kind} {name}: argument {f.name!r} has no comment"
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            assert "required" in notes[f.name], (
                f"{kind} {name}: {f.name!r} has no default and is not 'required'"
            )
            required.append(f.name)
    if required:
        with pytest.raises(ValueError, match=f"'{name}': argument '{required[0]}' is required"):
            registry.check(name, {})
    else:
        assert isinstance(registry.check(name, {}), args)
    with pytest.raises(ValueError, match=rf"'{name}': unknown argument 'surplus'; valid: "):
        registry.check(name, {**{r: None for r in required}, "surplus": 1})


def test_the_data_registry_is_one_of_them():
    assert REGISTRIES["data"] is SCHEDULERS
