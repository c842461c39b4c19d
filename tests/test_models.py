import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from schedrl.models import build_char_tokenizer, load_model_and_tokenizer, load_tokenizer, save_tiny_model
from schedrl.models.tiny import ALPHABET


def test_char_tokenizer_round_trips_every_character(tokenizer):
    text = "".join(ALPHABET)
    ids = tokenizer(text).input_ids
    assert len(ids) == len(text)  # one token per character, no specials added
    assert tokenizer.decode(ids) == text
    assert isinstance(tokenizer, PreTrainedTokenizerFast)


def test_unknown_characters_become_unk_not_dropped(tokenizer):
    ids = tokenizer("1é2").input_ids
    assert ids == [
        tokenizer.convert_tokens_to_ids("1"),
        tokenizer.unk_token_id,
        tokenizer.convert_tokens_to_ids("2"),
    ]


def test_tiny_model_saves_and_loads_back(tmp_path):
    path = save_tiny_model(tmp_path / "tiny")
    config = json.loads((path / "tokenizer_config.json").read_text())
    assert config["padding_side"] == "left"
    model, tok = load_model_and_tokenizer(path, device="cpu")
    assert model.config.model_type == "llama"
    n_params = sum(p.numel() for p in model.parameters())
    assert 300_000 < n_params < 700_000
    assert tok.padding_side == "left"
    assert {tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token} == {"<pad>", "<s>", "</s>", "<unk>"}
    # AutoTokenizer on the saved directory keeps the character-level tokenizer.
    auto = AutoTokenizer.from_pretrained(path)
    assert auto("12+34=").input_ids == build_char_tokenizer()("12+34=").input_ids
    ref = AutoModelForCausalLM.from_pretrained(path)
    x = torch.tensor([tok("12+3=").input_ids])
    torch.testing.assert_close(model(x).logits, ref(x).logits)


def test_directory_without_tokenizer_is_a_clear_error(tmp_path):
    path = save_tiny_model(tmp_path / "tiny")
    for f in path.glob("tokenizer*"):
        f.unlink()
    with pytest.raises(ValueError, match="has no tokenizer"):
        load_model_and_tokenizer(path)


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")
