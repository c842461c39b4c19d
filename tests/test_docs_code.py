"""Every code block in the docs and the README runs or is validated.

- ```python blocks run, page by page in one namespace, in a scratch directory that sees the repo's
  `examples/`; training runs are cut to a few steps (`resolve_config` is wrapped), so a block that trains
  runs for real at a tiny size. `<!-- docs-test: file NAME.py -->` before a block writes it to that file
  instead (importable by the blocks and recipes after it); `<!-- docs-test: compile-only (why) -->`
  compiles it and imports the schedrl names it uses.
- ```yaml blocks load as what they are: a simulator scenario (`workload:` or `cluster:`), a classic
  recipe (`env:`), or a run recipe, a fragment completed by the defaults.
- ```bash blocks: each command is `schedrl ...` (parsed by the command line's own parser), a Python file
  that exists, or one of a few setup commands; any other command fails the test.
- ```json blocks parse; ```text blocks are output and are not checked. A fence without a language fails.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import schedrl.api
from schedrl.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
LANGUAGES = {"python", "yaml", "bash", "json", "text"}
DIRECTIVE = re.compile(r"<!-- docs-test: (compile-only|file) ?(.*?) -->")
# commands a bash block may hold besides schedrl and python: setup and navigation
SETUP = {"cd", "git", "pip", "pip3", "apt", "apt-get", "sudo", "export", "source", "ls", "cat", "mkdir"}
SCRIPTS = {"scripts/test.sh", ".ci/run", "bench/gpu_check.sh"}
NEW_RUN_STEPS, RESUME_STEPS = 2, 4  # training in a python block: steps of a new run, of a resumed one


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    directive: tuple[str, str] | None

    def __str__(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page.name
        return f"{page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    out: list[Block] = []
    lines = page.read_text().split("\n")
    i = 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```(.*)$", lines[i])
        if not fence:
            i += 1
            continue
        start, lang = i, fence.group(2).strip()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith("```"):
            j += 1
        prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        found = DIRECTIVE.search(prev)
        directive = (found.group(1), found.group(2).strip()) if found else None
        indent = len(fence.group(1))
        code = "\n".join(line[indent:] for line in lines[start + 1 : j])
        out.append(Block(page, start + 1, lang, code, directive))
        i = j + 1
    return out


ALL = [b for page in PAGES for b in blocks(page)]


def test_the_docs_have_code_to_check() -> None:
    langs = {b.lang for b in ALL}
    assert {"python", "yaml", "bash"} <= langs
    assert len(ALL) > 30


@pytest.mark.parametrize("block", ALL, ids=str)
def test_every_fence_names_a_checked_language(block: Block) -> None:
    assert block.lang in LANGUAGES, f"{block}: fence language {block.lang!r}; use one of {sorted(LANGUAGES)}"


# ---- python ---------------------------------------------------------------------------------------


def _shrink(cfg, steps: int):
    r = dataclasses.replace
    return r(
        cfg,
        steps=min(cfg.steps, steps),
        sft=r(cfg.sft, steps=min(cfg.sft.steps, 2)),
        eval=r(cfg.eval, tasks=min(cfg.eval.tasks, 8), k=min(cfg.eval.k, 2), every=0),
        save_every=0,
    )


@pytest.fixture
def tiny_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A scratch directory with the repo's examples, where every run trains a few steps only."""
    resolve, saved = schedrl.api.resolve_config, schedrl.api.saved_config
    monkeypatch.setattr(
        schedrl.api, "resolve_config", lambda *a, **k: _shrink(resolve(*a, **k), NEW_RUN_STEPS)
    )
    monkeypatch.setattr(schedrl.api, "saved_config", lambda *a, **k: _shrink(saved(*a, **k), RESUME_STEPS))
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(ROOT))
    return tmp_path


def _schedrl_names(tree: ast.AST) -> list[tuple[str, list[str]]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("schedrl"):
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("schedrl")]
    return out


PY_PAGES = sorted({b.page for b in ALL if b.lang == "python"})


def run_python_blocks(page_blocks: list[Block], scratch: Path) -> None:
    namespace: dict = {"__name__": "__docs__"}
    for block in (b for b in page_blocks if b.lang == "python"):
        tree = compile(block.code, str(block), "exec", ast.PyCF_ONLY_AST)
        kind, arg = block.directive or ("run", "")
        if kind == "file":
            assert re.fullmatch(r"\w+\.py", arg), f"{block}: docs-test file needs a module name, got {arg!r}"
            (scratch / arg).write_text(block.code + "\n")
            sys.modules.pop(arg[:-3], None)
            importlib.import_module(arg[:-3])
            continue
        if kind == "compile-only":
            assert arg.startswith("(") and arg.endswith(")"), f"{block}: compile-only needs a (reason)"
            compile(tree, str(block), "exec")
            for module, names in _schedrl_names(tree):
                mod = importlib.import_module(module)
                missing = [n for n in names if not hasattr(mod, n)]
                assert not missing, f"{block}: {module} has no {missing}"
            continue
        try:
            exec(compile(tree, str(block), "exec"), namespace)
        except Exception as err:  # the block and its error, not the test's frame
            raise AssertionError(f"{block} raised {type(err).__name__}: {err}") from err


@pytest.mark.parametrize("page", PY_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(page: Path, tiny_runs: Path) -> None:
    run_python_blocks(blocks(page), tiny_runs)


def test_a_failing_python_block_fails(tiny_runs: Path) -> None:
    page = tiny_runs / "page.md"
    page.write_text(
        "```python\nx = 1\n```\n\n<!-- docs-test: compile-only (shown only) -->\n```python\n"
        "from schedrl import train\n```\n\n```python\nassert x == 2, 'x is 1'\n```\n"
    )
    with pytest.raises(AssertionError, match=r"page.md:10 raised AssertionError: x is 1"):
        run_python_blocks(blocks(page), tiny_runs)
    page.write_text(
        "<!-- docs-test: compile-only (shown only) -->\n```python\nfrom schedrl import nope\n```\n"
    )
    with pytest.raises(AssertionError, match="has no"):
        run_python_blocks(blocks(page), tiny_runs)


def test_runs_in_python_blocks_are_cut_short(tiny_runs: Path) -> None:
    cfg = schedrl.api.resolve_config("examples/demo.yaml")
    assert (cfg.steps, cfg.sft.steps, cfg.eval.tasks) == (NEW_RUN_STEPS, 2, 8)


# ---- yaml -----------------------------------------------------------------------------------------

YAML_BLOCKS = [b for b in ALL if b.lang == "yaml"]


def check_yaml_block(block: Block, page_blocks: list[Block], scratch: Path) -> None:
    from schedrl.classic import is_classic
    from schedrl.sim.scenario import variants_from_dict

    for page_block in page_blocks:  # modules the page writes, which its recipes may name
        if page_block.directive and page_block.directive[0] == "file":
            (scratch / page_block.directive[1]).write_text(page_block.code + "\n")
    data = yaml.safe_load(block.code)
    assert isinstance(data, dict), f"{block}: not a mapping"
    try:
        if "workload" in data or "cluster" in data:
            assert variants_from_dict(data, path=str(block))
        elif is_classic(data):
            schedrl.api.resolve_classic(data)
        else:
            schedrl.api.resolve_config(data)
    except Exception as err:
        raise AssertionError(f"{block}: {type(err).__name__}: {err}") from err


@pytest.fixture
def scratch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.chdir(ROOT)
    return tmp_path


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=str)
def test_yaml_blocks_load_as_configs(block: Block, scratch: Path) -> None:
    check_yaml_block(block, blocks(block.page), scratch)


def test_a_bad_yaml_block_fails(scratch: Path) -> None:
    for code, match in (
        ("optim: {lr: -1}", "optim.lr"),
        ("schedule: {admission: nope}", "admission"),
        ("env: {id: CartPole-v1}\nppo: {gamma: 2}", "gamma"),
        ("cluster: {gpus: 0}", "gpus"),
    ):
        with pytest.raises(AssertionError, match=match):
            check_yaml_block(Block(ROOT / "README.md", 1, "yaml", code, None), [], scratch)


# ---- bash -----------------------------------------------------------------------------------------


def _commands(code: str) -> list[list[str]]:
    """Each simple command of a shell block as words: continuations joined, comments dropped, split at
    `&&`, `||`, `;` and `|`."""
    text = re.sub(r"\\\n", " ", code)
    out = []
    for line in text.split("\n"):
        words = shlex.split(line, comments=True)
        cmd: list[str] = []
        for w in [*words, ";"]:
            if w in ("&&", "||", ";", "|"):
                if cmd:
                    out.append(cmd)
                cmd = []
            else:
                cmd.append(w)
    return out


def check_command(words: list[str]) -> str | None:
    """Why `words` is not a command the docs may show (None: it is)."""
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words = words[1:]  # VAR=value prefixes
    if not words:
        return None
    head = words[0].removeprefix(".venv/bin/").removeprefix(".venv-vllm/bin/")
    if head == "schedrl":
        try:
            build_parser().parse_args(words[1:])
        except SystemExit:
            return f"the schedrl command line rejects {shlex.join(words)!r}"
        paths = [w for w in words[1:] if w.startswith(("examples/", "bench/")) and "..." not in w]
        missing = [p for p in paths if not (ROOT / p).exists()]
        return f"no such file: {missing}" if missing else None
    if head in ("python", "python3"):
        rest = words[1:]
        if rest[:2] == ["-m", "venv"] or rest[:2] == ["-m", "pip"]:
            return None
        script = next((w for w in rest if not w.startswith("-")), None)
        if script is None or not script.endswith(".py"):
            return f"python runs a file of the repo here, got {shlex.join(words)!r}"
        return None if (ROOT / script).is_file() else f"no such file: {script}"
    if head in SCRIPTS or words[0] in SCRIPTS:
        return None if (ROOT / words[0]).exists() else f"no such script: {words[0]}"
    if head in SETUP:
        return None
    return f"unknown command {words[0]!r} (schedrl, python FILE.py, scripts, or {sorted(SETUP)})"


BASH_BLOCKS = [b for b in ALL if b.lang == "bash"]


@pytest.mark.parametrize("block", BASH_BLOCKS, ids=str)
def test_shell_blocks_are_commands_that_exist(block: Block) -> None:
    problems = [f"{shlex.join(c)}: {why}" for c in _commands(block.code) if (why := check_command(c))]
    assert not problems, f"{block}: " + "; ".join(problems)


def test_the_shell_check_refuses_what_does_not_exist() -> None:
    assert check_command(["schedrl", "train", "examples/demo.yaml", "--set", "steps=3"]) is None
    assert "rejects" in (check_command(["schedrl", "trian", "examples/demo.yaml"]) or "")
    assert "rejects" in (check_command(["schedrl", "train", "--no-such-flag"]) or "")
    assert "no such file" in (check_command(["schedrl", "train", "examples/nope.yaml"]) or "")
    assert "no such file" in (check_command(["python", "bench/nope.py"]) or "")
    assert "unknown command" in (check_command(["make", "docs"]) or "")
    assert check_command(["OMP_NUM_THREADS=1", "python", "bench/tool_waits.py", "--rounds", "1"]) is None
    assert _commands("a && b # c\nd \\\n e | f") == [["a"], ["b"], ["d", "e"], ["f"]]


# ---- json -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", [b for b in ALL if b.lang == "json"], ids=str)
def test_json_blocks_parse(block: Block) -> None:
    json.loads(block.code)
