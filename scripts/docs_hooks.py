"""MkDocs hooks: the configuration reference is generated from the config dataclasses' field comments.

A page holding `<!-- config-reference: RunConfig -->` (or `ClassicConfig`, `Scenario`) gets that tree's
tables in its place (`schedrl.config_reference.reference`), so the page cannot drift from the code.
"""

from __future__ import annotations

import re

MARKER = re.compile(r"<!-- config-reference: (\w+) -->")


def _classes() -> dict[str, tuple[type, str]]:
    from schedrl.classic.config import ClassicConfig
    from schedrl.config import RunConfig
    from schedrl.sim.scenario import Scenario

    return {
        "RunConfig": (RunConfig, "Run recipes (`schedrl train`, `schedrl.train`)"),
        "ClassicConfig": (ClassicConfig, "Classic PPO recipes (a recipe with `env:`)"),
        "Scenario": (Scenario, "Simulator scenarios (`schedrl simulate`)"),
    }


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs' signature)
    if not MARKER.search(markdown):
        return markdown
    from schedrl.config_reference import reference

    classes = _classes()

    def table(match: re.Match) -> str:
        name = match.group(1)
        if name not in classes:
            raise ValueError(f"{page.file.src_path}: no config class {name!r} (known: {sorted(classes)})")
        cls, title = classes[name]
        return reference(cls, title)

    return MARKER.sub(table, markdown)
