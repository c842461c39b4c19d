"""Load any HF causal LM and its tokenizer from a local directory, offline."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@contextmanager
def hf_output(verbose: bool) -> Iterator[None]:
    """transformers' progress bars and warnings off for the block (on, with `verbose`), then as they were."""
    from transformers.utils import logging as hf_logging

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    if verbose:
        hf_logging.enable_progress_bar()
        hf_logging.set_verbosity_warning()
    else:
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()


def quiet_hf() -> None:
    """Offline, and no progress bars or warnings from transformers: the command line shows its own."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def default_device() -> torch.device:
    """CUDA when present, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer saved in `path`; left padding, and a pad token if the model has none."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {str(path)!r} does not exist")
    if not any((path / f).exists() for f in _TOKENIZER_FILES):
        raise ValueError(
            f"model directory {str(path)!r} has no tokenizer (expected one of {', '.join(_TOKENIZER_FILES)}); "
            "save one there with tokenizer.save_pretrained(path)"
        )
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer in {str(path)!r} has neither a pad token nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    path: str | Path, device: str | torch.device | None = None, dtype: torch.dtype | None = None
) -> PreTrainedModel:
    """Load a causal LM from `path` in eval mode, without touching the network."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"model directory {str(path)!r} has no config.json")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype or torch.float32)
    move_to(model, device or default_device())
    return model.eval()


def move_to(model: torch.nn.Module, device: str | torch.device) -> None:
    """`model.to(device)`, in place (transformers' typed overloads of `to` hide that it returns the model)."""
    torch.nn.Module.to(model, device)


def load_model_and_tokenizer(
    path: str | Path, device: str | torch.device | None = None, dtype: torch.dtype | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Tokenizer first, so a directory without one fails before the weights are read."""
    tokenizer = load_tokenizer(path)
    return load_model(path, device, dtype), tokenizer
