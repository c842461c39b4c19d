"""Crash-consistent checkpoints: a kill at each step of the protocol, a full disk, rotation."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from schedrl.models import build_char_tokenizer, build_tiny_model, load_model_and_tokenizer
from schedrl.training.checkpoint import (
    POINTS,
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)

SAVE_TWO = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from schedrl.models import build_char_tokenizer, build_tiny_model
    from schedrl.training.checkpoint import save_checkpoint

    ckpt, point = Path(sys.argv[1]), sys.argv[2]
    tok = build_char_tokenizer()
    model = build_tiny_model(tok)
    save_checkpoint(ckpt, 1, model, tok, {"opt": 1}, {"note": "first"})

    def stop(at):
        if at == point:
            os.kill(os.getpid(), signal.SIGKILL)

    save_checkpoint(ckpt, 2, model, tok, {"opt": 2}, {"note": "second"}, at=stop)
    """
)


def _loadable(path: Path) -> dict:
    state, trainer, _ = load_checkpoint(path)
    load_model_and_tokenizer(path / "model", device="cpu")
    return {"step": state["step"], "trainer": trainer}


@pytest.mark.subprocess
@pytest.mark.parametrize("point", POINTS)
def test_a_kill_at_each_step_of_the_protocol_leaves_latest_complete(tmp_path, point):
    ckpt = tmp_path / "checkpoints"
    done = subprocess.run(
        [sys.executable, "-c", SAVE_TWO, str(ckpt), point], capture_output=True, timeout=300
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    latest = latest_checkpoint(ckpt)
    assert latest is not None
    got = _loadable(latest)
    # until the pointer's rename the old checkpoint is the latest; after it, the new one
    assert got["step"] == (2 if point == "pointed" else 1)
    assert got["trainer"] == {"opt": got["step"]}


def test_a_full_disk_leaves_the_previous_checkpoint_and_names_the_path(tmp_path, monkeypatch):
    tok = build_char_tokenizer()
    model = build_tiny_model(tok)
    ckpt = tmp_path / "checkpoints"
    save_checkpoint(ckpt, 1, model, tok, {"opt": 1}, {})
    real_save = torch.save

    def full(obj, f, *args, **kwargs):
        if str(f).endswith("trainer.pt"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(
        CheckpointError, match=r"step_000002 could not be written \(the disk is full; [\d.]+ MiB free"
    ):
        save_checkpoint(ckpt, 2, model, tok, {"opt": 2}, {})
    assert latest_checkpoint(ckpt) == ckpt / "step_000001"
    assert not list(ckpt.glob(".tmp_*")), "the half-written checkpoint was left behind"
    monkeypatch.setattr(torch, "save", real_save)
    assert _loadable(ckpt / "step_000001")["step"] == 1


def test_keep_last_rotates_old_checkpoints(tmp_path):
    tok = build_char_tokenizer()
    model = build_tiny_model(tok)
    ckpt = tmp_path / "checkpoints"
    for step in range(1, 6):
        save_checkpoint(ckpt, step, model, tok, {}, {}, keep_last=2)
    assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_000004", "step_000005"]
    with pytest.raises(ValueError, match="keep_last must be >= 1"):
        save_checkpoint(ckpt, 6, model, tok, {}, {}, keep_last=0)
