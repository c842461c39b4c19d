"""The package's import graph: no cycles (not even ones hidden in a function-level import), no private
name imported across modules, and the layers the architecture names (the engine knows nothing of
rollout scheduling; only `distributed/` imports Ray)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "schedrl"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Line numbers inside `if TYPE_CHECKING:` blocks: imports for annotations only."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.If)
            and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
        ):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports(name: str) -> list[tuple[str, str | None, int]]:
    """(module imported, name imported from it or None, line) for every import in `name`, at any depth."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            for a in node.names:
                out.append((base, a.name, node.lineno))
    return out


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for m in MODULES:
        for target, name, _ in _imports(m):
            if not target.startswith("schedrl"):
                continue
            full = f"{target}.{name}" if name else target
            dep = full if full in MODULES else target
            if dep in MODULES and dep != m:
                graph[m].add(dep)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_no_private_name_is_imported_from_another_module():
    bad = [
        f"{m} line {line}: {name} from {target}"
        for m in MODULES
        for target, name, line in _imports(m)
        if target.startswith("schedrl") and name and name.startswith("_") and not name.startswith("__")
    ]
    assert bad == []


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("schedrl.engine", "schedrl.rollout"),
        ("schedrl.engine", "schedrl.orchestrate"),
        ("schedrl.algos", "schedrl.training"),
    ],
)
def test_lower_layers_do_not_import_upper_ones(package, forbidden):
    graph = _graph()
    bad = [(m, d) for m in graph if m.startswith(package) for d in graph[m] if d.startswith(forbidden)]
    assert bad == []


def test_only_distributed_imports_ray():
    bad = [
        f"{m} line {line}"
        for m in MODULES
        if not m.startswith("schedrl.distributed")
        for target, _, line in _imports(m)
        if target == "ray" or target.startswith("ray.")
    ]
    assert bad == []


def test_config_is_a_leaf():
    """Parsing a config imports nothing else of schedrl: the policies check their own arguments
    (`schedrl.orchestrate.check`), so config.py is never part of an import cycle."""
    assert [t for t, _, _ in _imports("schedrl.config") if t.startswith("schedrl")] == []


SATELLITES = ("schedrl.classic", "schedrl.envs.scheduling", "schedrl.sim")
ENTRY_POINTS = ("schedrl.api", "schedrl.cli", "schedrl.cli_train")  # the commands reach every package


def test_core_never_imports_the_satellites():
    graph = _graph()
    core = [m for m in graph if not m.startswith((*SATELLITES, *ENTRY_POINTS))]
    bad = [(m, d) for m in core for d in graph[m] if d.startswith(SATELLITES)]
    assert bad == []
