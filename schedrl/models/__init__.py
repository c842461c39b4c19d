"""HF causal LMs from local directories, and the offline tiny-model factory."""

from schedrl.models.loading import default_device, load_model, load_model_and_tokenizer, load_tokenizer
from schedrl.models.tiny import (
    PRESETS,
    TinyModelConfig,
    build_char_tokenizer,
    build_tiny_model,
    preset,
    save_tiny_model,
)

__all__ = [
    "TinyModelConfig",
    "build_char_tokenizer",
    "PRESETS",
    "build_tiny_model",
    "preset",
    "default_device",
    "load_model",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "save_tiny_model",
]
