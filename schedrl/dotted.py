"""Objects named by dotted path in a config: rewards, environments, tools.

``"package.module:name"`` or ``"package.module.name"``; modules are looked up on the import path
and, after it, in the working directory (as ``python -m`` does), so a module beside the recipe
imports without PYTHONPATH. Every failure is a `ValueError` that names the path.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any


def load_object(path: str, what: str = "object") -> Callable[..., Any]:
    """The callable (function or class) at `path`; `what` names it in errors ("reward", "tool", ...)."""
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"{what} must be a dotted path like 'pkg.module:function', got {path!r}")
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{what} {path!r}: expected 'package.module:function' or 'package.module.function'")
    if os.getcwd() not in sys.path and "" not in sys.path:  # as `python -m`: modules in the working directory
        sys.path.append(os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # any import-time failure is the user's module; report it with the path
        raise ValueError(f"{what} {path!r}: cannot import module {module_name!r}: {e}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{what} {path!r}: {obj.__name__!r} has no attribute {part!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{what} {path!r}: {type(obj).__name__} object is not callable")
    return obj
