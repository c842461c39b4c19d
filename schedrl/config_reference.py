"""The configuration reference: every field of a config dataclass tree with its type, default and doc.

A field's doc is its source comment: the comment at the end of its line, or the comment lines right
above it. `reference(RunConfig, "run recipe")` is the Markdown the documentation site's configuration
page is built from (`scripts/docs_hooks.py`), so the page cannot drift from the code.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import textwrap
import tokenize
import typing
from typing import Any


def field_docs(cls: type) -> dict[str, str]:
    """{field name: its comment} for the fields of dataclass `cls` that have one."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[int, str] = {}  # line -> comment text
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    docs: dict[str, str] = {}
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        end = node.end_lineno or node.lineno
        trailing = [comments[n] for n in range(node.lineno, end + 1) if n in comments and n in code_lines]
        above, n = [], node.lineno - 1
        while n in comments and n not in code_lines:
            above.insert(0, comments[n])
            n -= 1
        text = " ".join(above + trailing).strip()
        if text:
            docs[node.target.id] = text
    return docs


def _type(tp: Any) -> str:
    text = str(tp) if not isinstance(tp, type) else tp.__name__
    return text.replace("typing.", "").replace("NoneType", "None")


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return "" if dataclasses.is_dataclass(value) else repr(value)
    return "required"


def _code(text: str) -> str:
    """A code span in a table cell: MkDocs' tables keep a pipe inside backticks as text."""
    return text.replace("\n", " ")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def sections(cls: type, prefix: str = "") -> list[tuple[str, type]]:
    """(dotted section name, dataclass) for `cls` and every dataclass field under it, depth first."""
    out = [(prefix, cls)]
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out += sections(tp, f"{prefix}{f.name}.")
    return out


def reference(cls: type, title: str, level: int = 2) -> str:
    """Markdown: one table per section of `cls` (field, type, default, doc), top level first."""
    lines = [f"{'#' * level} {title}", ""]
    for prefix, section in sections(cls):
        hints, docs = typing.get_type_hints(section), field_docs(section)
        rows = [f for f in dataclasses.fields(section) if not dataclasses.is_dataclass(hints[f.name])]
        if not rows:
            continue
        name = prefix.rstrip(".") or "top level"
        lines += [f"{'#' * (level + 1)} `{name}`" if prefix else f"{'#' * (level + 1)} {name}", ""]
        doc = inspect.getdoc(section)
        if doc and not doc.startswith(section.__name__ + "("):  # a written docstring, not the generated one
            lines += [doc.split("\n\n")[0].replace("\n", " "), ""]
        lines += ["| field | type | default | what it does |", "|---|---|---|---|"]
        for f in rows:
            lines.append(
                f"| `{prefix}{f.name}` | `{_code(_type(hints[f.name]))}` | `{_code(_default(f))}` "
                f"| {_cell(docs.get(f.name, ''))} |"
            )
        lines.append("")
    return "\n".join(lines)


def undocumented(cls: type) -> list[str]:
    """Dotted names of the fields under `cls` without a doc comment."""
    missing = []
    for prefix, section in sections(cls):
        hints, docs = typing.get_type_hints(section), field_docs(section)
        for f in dataclasses.fields(section):
            if not dataclasses.is_dataclass(hints[f.name]) and f.name not in docs:
                missing.append(prefix + f.name)
    return missing
