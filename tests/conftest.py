import pytest
import torch

from schedrl.models import TinyModelConfig, build_char_tokenizer, build_tiny_model


@pytest.fixture(scope="session")
def tokenizer():
    return build_char_tokenizer()


def peaked_model(tokenizer, seed):
    """A wide init makes logits peaked, so greedy argmax has clear margins and float
    noise between batched and unbatched kernels cannot flip a token. A larger eos
    embedding (tied to the output row) makes greedy outputs end at mixed lengths."""
    model = build_tiny_model(tokenizer, TinyModelConfig(initializer_range=0.2, seed=seed))
    with torch.no_grad():
        model.model.embed_tokens.weight[tokenizer.eos_token_id] *= 2.0
    return model


@pytest.fixture(scope="session")
def model(tokenizer):
    torch.set_num_threads(1)
    return peaked_model(tokenizer, seed=3)


@pytest.fixture(scope="session")
def other_model(tokenizer):
    return peaked_model(tokenizer, seed=2)


@pytest.fixture(scope="session")
def default_model(tokenizer):
    """The tiny model exactly as the factory builds it."""
    return build_tiny_model(tokenizer)
