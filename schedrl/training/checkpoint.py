"""Checkpoints that resume a run exactly: weights, optimizer, LR schedule, RNG states, data position.

A checkpoint is a directory `checkpoints/step_000050/` holding `model/` (an HF model
directory: safetensors weights, config, tokenizer, so `schedrl eval --model` can read
it), `trainer.pt` (optimizer, scheduler, guard counters), `rng.pt` and `state.json`.

The protocol, each step durable before the next: write everything into `.tmp_step_N/`; fsync
every file and the directory; rename it to `step_N/` and fsync `checkpoints/`; write the pointer
`.latest.tmp`, fsync it, rename it over `latest`, fsync `checkpoints/`; then delete all but the
newest `keep_last`. A kill at any point leaves `latest` naming a complete checkpoint (the old one
until the pointer's rename, the new one after). A write that fails (a full disk) removes the
temporary directory and raises `CheckpointError` naming the path and the free space; the
previous checkpoint stays valid and `latest`.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

LATEST = "latest"
# where a test may stop the protocol: after writing, after the fsyncs, after the rename, after the pointer
POINTS = ("written", "synced", "renamed", "pointed")


class CheckpointError(OSError):
    """A checkpoint could not be written; the previous one is intact."""


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(Path(dirpath))


def _write(
    tmp: Path, model, tokenizer, trainer_state: dict, state: dict, weights: dict | None = None
) -> None:
    model.save_pretrained(tmp / "model", state_dict=weights)
    tokenizer.save_pretrained(tmp / "model")
    torch.save(trainer_state, tmp / "trainer.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps(state, indent=1))


def save_checkpoint(
    ckpt_dir: Path,
    step: int,
    model,
    tokenizer,
    trainer_state: dict,
    state: dict,
    keep_last: int | None = 3,
    at: Callable[[str], None] | None = None,
    weights: dict | None = None,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write checkpoint `step` by the protocol above; keep the newest `keep_last`. `at(point)` is called
    after each step of the protocol (`POINTS`), for tests that stop it there. `weights`: the model's
    full state dict, where `model` holds only a shard of it (a learner rank) or adapters beside it;
    `extra(tmp_dir)` writes more into the checkpoint (LoRA adapters)."""

    def write(tmp: Path) -> None:
        if extra is not None:
            extra(tmp)
        _write(tmp, model, tokenizer, trainer_state, {"step": step, **state}, weights)

    return write_checkpoint(ckpt_dir, step, write, keep_last, at)


def temporary_dir(ckpt_dir: Path, step: int) -> Path:
    """Where checkpoint `step` is written before it is renamed complete."""
    return ckpt_dir / f".tmp_step_{step:06d}"


def write_checkpoint(
    ckpt_dir: Path,
    step: int,
    write: Callable[[Path], None],
    keep_last: int | None = 3,
    at: Callable[[str], None] | None = None,
) -> Path:
    """The protocol above around `write(tmp_dir)`, which fills the checkpoint (its `state.json` last: a
    checkpoint without one is incomplete)."""
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last!r}")
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step_{step:06d}"
    tmp = temporary_dir(ckpt_dir, step)
    current = latest_checkpoint(ckpt_dir)
    if current is not None and current.name == final.name:
        return final  # this step is already the latest complete checkpoint (a resume that saves it again)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        write(tmp)
        _mark(at, "written")
        _fsync_tree(tmp)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(ckpt_dir).free
        kind = (
            "the disk is full"
            if err.errno in (errno.ENOSPC, errno.EDQUOT)
            else f"{type(err).__name__}: {err}"
        )
        raise CheckpointError(
            err.errno or 0,
            f"checkpoint {final} could not be written ({kind}; {free / 2**20:.1f} MiB free in {ckpt_dir}); "
            f"the previous checkpoint ({current or 'none'}) is intact",
        ) from err
    _mark(at, "synced")
    shutil.rmtree(final, ignore_errors=True)  # a stale copy from before a crash: `latest` does not name it
    os.replace(tmp, final)
    _fsync_dir(ckpt_dir)
    _mark(at, "renamed")
    pointer = ckpt_dir / f".{LATEST}.tmp"
    with open(pointer, "w") as f:
        f.write(final.name)
        f.flush()
        os.fsync(f.fileno())
    os.replace(pointer, ckpt_dir / LATEST)
    _fsync_dir(ckpt_dir)
    _mark(at, "pointed")
    for old in sorted(ckpt_dir.glob("step_*"))[: -keep_last if keep_last else 0]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _mark(at: Callable[[str], None] | None, point: str) -> None:
    if at is not None:
        at(point)


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    pointer = ckpt_dir / LATEST
    if not pointer.exists():
        return None
    path = ckpt_dir / pointer.read_text().strip()
    if not (path / "state.json").exists():
        raise FileNotFoundError(
            f"checkpoint pointer {str(pointer)!r} names {str(path)!r}, which is incomplete"
        )
    return path


def load_checkpoint(path: Path) -> tuple[dict, dict, dict]:
    """(state.json contents, trainer state, rng state); the weights are read from `path / "model"`."""
    state = json.loads((path / "state.json").read_text())
    trainer_state = torch.load(path / "trainer.pt", weights_only=False)
    rng = torch.load(path / "rng.pt", weights_only=False)
    return state, trainer_state, rng
