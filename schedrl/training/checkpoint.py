"""Checkpoints that resume a run exactly: weights, optimizer, LR schedule, RNG states, data position.

A checkpoint is a directory `checkpoints/step_000050/` holding `model/` (an HF model
directory: safetensors weights, config, tokenizer, so `schedrl eval --model` can read
it), `trainer.pt` (optimizer, scheduler, guard counters), `rng.pt` and `state.json`.
It is written to a temporary directory and renamed into place, and `latest` is
replaced atomically after that, so a SIGKILL at any moment leaves the previous
checkpoint intact.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

LATEST = "latest"


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


def save_checkpoint(
    ckpt_dir: Path, step: int, model, tokenizer, trainer_state: dict, state: dict, keep_last: int = 3
) -> Path:
    """Write checkpoint `step` atomically; keep the newest `keep_last` checkpoints."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step_{step:06d}"
    tmp = ckpt_dir / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(tmp / "model")
    tokenizer.save_pretrained(tmp / "model")
    torch.save(trainer_state, tmp / "trainer.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    pointer = ckpt_dir / f".{LATEST}.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, ckpt_dir / LATEST)
    for old in sorted(ckpt_dir.glob("step_*"))[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


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
