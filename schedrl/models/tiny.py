"""Offline tiny models: a character-level tokenizer and a small Llama, built locally.

The demo and the tests need a real HF causal LM without a network. The tokenizer
is built with the `tokenizers` library (one token per printable ASCII character)
and wrapped as a `PreTrainedTokenizerFast`; the model is a `LlamaForCausalLM`.
A Llama config is used on purpose: with a Qwen2 config `AutoTokenizer` swaps in
Qwen's pre-tokenizer, which silently drops characters it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers import models as tok_models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
ALPHABET = tuple(chr(c) for c in range(32, 127)) + ("\n",)


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the tiny Llama; the defaults give about 0.45M parameters."""

    hidden_size: int = 128  # width of the residual stream
    num_layers: int = 2  # decoder blocks
    num_heads: int = 4  # attention heads (also key/value heads)
    intermediate_size: int = 384  # MLP width
    max_position_embeddings: int = 512  # context length in tokens
    initializer_range: float = 0.02  # std of the weight init
    seed: int = 0  # torch seed for the weight init


# Built-in model shapes by name (`model.preset`, the benchmarks' `--model`): `tiny` (about 0.45M
# parameters, where Python overhead dominates a step) and `small` (about 25M, hidden 512 and 8 layers: a
# step's cost is mostly matrix products, as at real sizes); `0.5b` (about 476M, hidden 1,280 and 24 layers,
# Qwen2.5-0.5B's scale) is for the GPU checks (`bench/gpu_check.sh`), not for runs on a CPU.
PRESETS: dict[str, TinyModelConfig] = {
    "tiny": TinyModelConfig(),
    "small": TinyModelConfig(hidden_size=512, num_layers=8, num_heads=8, intermediate_size=1344),
    "0.5b": TinyModelConfig(hidden_size=1280, num_layers=24, num_heads=20, intermediate_size=3456),
}


def preset(name: str, seed: int = 0) -> TinyModelConfig:
    """The shape named `name` (a key of PRESETS) with weight-init seed `seed`."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; valid: {', '.join(PRESETS)}")
    return replace(PRESETS[name], seed=seed)


# A chat template short enough for the tiny model's context: "role: content" lines, an assistant turn
# closed by the eos token, and "assistant: " to prompt the next one.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer over printable ASCII and newline, with a chat template; left padding."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + ALPHABET)}
    backend = Tokenizer(tok_models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=TinyModelConfig.max_position_embeddings,
        chat_template=CHAT_TEMPLATE,
    )


def _token_id(tokenizer: PreTrainedTokenizerBase, name: str) -> int:
    """The id of the tokenizer's `name` special token ("pad", "bos", "eos"), which the model config needs."""
    value = getattr(tokenizer, f"{name}_token_id")
    if not isinstance(value, int):
        raise ValueError(f"the tokenizer has no single {name} token id (got {value!r})")
    return value


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast, cfg: TinyModelConfig | None = None
) -> LlamaForCausalLM:
    """A randomly initialised small Llama whose vocabulary matches `tokenizer`."""
    cfg = cfg or TinyModelConfig()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        initializer_range=cfg.initializer_range,
        pad_token_id=_token_id(tokenizer, "pad"),
        bos_token_id=_token_id(tokenizer, "bos"),
        eos_token_id=_token_id(tokenizer, "eos"),
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval()


def save_tiny_model(path: str | Path, cfg: TinyModelConfig | None = None) -> Path:
    """Build the tiny tokenizer and model and write both to `path` with `save_pretrained`."""
    path = Path(path)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, cfg)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
