"""The documentation site's generated parts: the loop picture and the configuration reference."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from schedrl.classic.config import ClassicConfig
from schedrl.config import RunConfig, Schedule
from schedrl.config_reference import field_docs, reference, undocumented
from schedrl.orchestrate.schedule import POLICIES
from schedrl.sim.scenario import Scenario

ROOT = Path(__file__).resolve().parent.parent


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_the_loop_picture_is_drawn_by_its_script_and_names_every_policy(tmp_path: Path) -> None:
    draw = _load(ROOT / "scripts" / "draw_loop.py", "draw_loop")
    out = draw.draw(tmp_path / "loop.svg")
    committed = ROOT / "docs" / "images" / "loop.svg"
    assert out.read_text() == committed.read_text(), (
        "docs/images/loop.svg is stale: python scripts/draw_loop.py"
    )
    text = out.read_text()
    for slot in [*POLICIES, "max_staleness"]:
        assert f"schedule.{slot}" in text, f"the loop picture does not show schedule.{slot}"
    assert {f.name for f in dataclasses.fields(Schedule)} >= set(POLICIES)


@pytest.mark.parametrize("cls", [RunConfig, ClassicConfig, Scenario], ids=lambda c: c.__name__)
def test_every_config_field_is_documented(cls: type) -> None:
    assert undocumented(cls) == []


@dataclass
class _Inner:
    depth: int = 2  # how deep


@dataclass
class _Example:
    plain: int = 1  # a trailing comment
    # a comment above,
    # on two lines
    above: str = "x"
    bare: float = 0.5
    multi: tuple[int, ...] = (  # starts here
        1,
        2,
    )
    inner: _Inner = field(default_factory=_Inner)


def test_field_docs_reads_trailing_and_preceding_comments() -> None:
    assert field_docs(_Example) == {
        "plain": "a trailing comment",
        "above": "a comment above, on two lines",
        "multi": "starts here",
    }
    assert undocumented(_Example) == ["bare"]


def test_reference_is_one_table_per_section_with_type_default_and_doc() -> None:
    text = reference(_Example, "Example")
    assert "| `plain` | `int` | `1` | a trailing comment |" in text
    assert "| `bare` | `float` | `0.5` |  |" in text
    assert "### `inner`" in text and "| `inner.depth` | `int` | `2` | how deep |" in text
    run = reference(RunConfig, "Run")
    assert re.search(r"\| `optim\.lr` \| `float` \| `0\.0003` \| peak learning rate \|", run)
    assert "| `schedule.admission` |" in run


def test_the_docs_hook_expands_markers_and_refuses_unknown_names() -> None:
    hooks = _load(ROOT / "scripts" / "docs_hooks.py", "docs_hooks")

    class Page:
        class file:
            src_path = "reference/config.md"

    out = hooks.on_page_markdown("# Ref\n\n<!-- config-reference: Scenario -->\n", Page, None, None)
    assert "| `workload.group_size` |" in out and "config-reference" not in out
    with pytest.raises(ValueError, match="no config class 'Nope'"):
        hooks.on_page_markdown("<!-- config-reference: Nope -->", Page, None, None)
    page = (ROOT / "docs" / "reference" / "config.md").read_text()
    assert {m for m in re.findall(r"config-reference: (\w+)", page)} == {
        "RunConfig",
        "ClassicConfig",
        "Scenario",
    }
