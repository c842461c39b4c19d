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


def test_presets_name_the_built_in_sizes():
    from schedrl.models import PRESETS, build_tiny_model, preset

    tok = build_char_tokenizer()
    counts = {}
    for name in PRESETS:
        with torch.device("meta"):  # shapes only: the 0.5b preset would take 2 GB
            model = build_tiny_model(tok, preset(name))
        counts[name] = sum(p.numel() for p in model.parameters())
    # tiny: 2 layers of width 128; small: 8 layers of width 512 (4 * 512^2 + 3 * 512 * 1344 per layer)
    assert 0.4e6 < counts["tiny"] < 0.5e6
    per_layer = 4 * 512**2 + 3 * 512 * 1344 + 2 * 512
    assert counts["small"] == 8 * per_layer + len(tok) * 512 + 512
    per_layer = 4 * 1280**2 + 3 * 1280 * 3456 + 2 * 1280
    assert counts["0.5b"] == 24 * per_layer + len(tok) * 1280 + 1280
    assert preset("small", seed=3).seed == 3 and preset("small").hidden_size == 512
    with pytest.raises(ValueError, match="unknown model preset 'huge'; valid: tiny, small, 0.5b"):
        preset("huge")


def test_model_preset_builds_the_small_model_for_a_run():
    from schedrl.api import resolve_config
    from schedrl.config import ConfigError
    from schedrl.orchestrate.build import load_policy

    cfg = resolve_config(None, {"model": {"preset": "small"}})
    model, _ = load_policy(cfg, None, torch.device("cpu"))
    assert model.config.hidden_size == 512 and model.config.num_hidden_layers == 8
    with pytest.raises(ConfigError, match="model.preset"):
        resolve_config(None, {"model": {"preset": "medium"}})
