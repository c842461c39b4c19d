"""The engine's input-major linear weights: same results, same state dict, weight swaps keep the layout."""

from __future__ import annotations

import torch
from torch import nn

from schedrl.engine import EngineConfig, HFEngine
from schedrl.engine.weight_layout import is_input_major, store_input_major
from schedrl.models import build_char_tokenizer, build_tiny_model


def test_linear_results_are_unchanged_and_the_storage_is_transposed() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(48, 80)
    x = torch.randn(3, 7, 48)
    before = layer(x)
    assert store_input_major(layer) == 1
    assert layer.weight.shape == (80, 48) and layer.weight.stride() == (1, 80)
    assert is_input_major(layer.weight) and layer.weight.t().is_contiguous()
    torch.testing.assert_close(layer(x), before, atol=1e-5, rtol=1e-5)
    assert store_input_major(layer) == 0  # already input-major: left alone


def test_copying_new_weights_writes_through_the_view() -> None:
    layer = nn.Linear(16, 24, bias=False)
    store_input_major(layer)
    new = torch.randn(24, 16)
    with torch.no_grad():
        layer.state_dict()["weight"].copy_(new)
    assert is_input_major(layer.weight)
    x = torch.randn(5, 16)
    torch.testing.assert_close(layer(x), x @ new.t(), atol=1e-5, rtol=1e-5)


def test_tied_embeddings_are_rewritten_once_and_still_look_up_rows() -> None:
    tok = build_char_tokenizer()
    model = build_tiny_model(tok)
    emb, head = model.model.embed_tokens.weight, model.lm_head.weight
    assert emb is head
    rows = emb[torch.tensor([3, 7])].clone()
    ids = torch.tensor([[5, 9, 11, 4]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
    n_linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    assert store_input_major(model) == n_linear  # lm_head's weight is the embedding's: once
    assert is_input_major(model.lm_head.weight) and model.model.embed_tokens.weight is model.lm_head.weight
    torch.testing.assert_close(model.model.embed_tokens(torch.tensor([3, 7])), rows)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, before, atol=1e-4, rtol=1e-4)


def test_the_engine_stores_its_copy_input_major_and_swaps_weights_into_it() -> None:
    tok = build_char_tokenizer()
    model = build_tiny_model(tok)
    engine = HFEngine(model, tok, EngineConfig(max_concurrency=4))
    plain = HFEngine(model, tok, EngineConfig(max_concurrency=4, input_major_weights=False))
    proj = engine.model.model.layers[0].mlp.down_proj.weight
    assert is_input_major(proj)
    assert not is_input_major(plain.model.model.layers[0].mlp.down_proj.weight)
    assert not is_input_major(model.model.layers[0].mlp.down_proj.weight)  # the caller's model is untouched
    other = build_tiny_model(tok)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.01)
    engine.update_weights(other.state_dict(), version=1)
    assert is_input_major(proj)
    torch.testing.assert_close(proj, other.model.layers[0].mlp.down_proj.weight)


def test_split_decode_rows_sends_a_long_history_alone_and_keeps_similar_lengths_together() -> None:
    from schedrl.engine.hf import split_decode_rows

    short = [(i, i, 9) for i in range(31)]  # 31 rows of 10 keys
    together, alone = split_decode_rows([*short, (31, 31, 999)], call_keys=160)
    # together: 31 x 10 = 310 keys, plus 1,000 + 160 alone, against 32 x 1,000 all together
    assert alone == [(31, 31, 999)] and sorted(together) == short
    similar = [(i, i, 500 + i) for i in range(8)]
    together, alone = split_decode_rows(similar, call_keys=160)
    assert alone == [] and len(together) == 8  # 8 x 508 keys < 8 x ~504 + 8 x 160
    together, alone = split_decode_rows(similar, call_keys=0)
    assert together == [(0, 0, 500)] and len(alone) == 7  # no call overhead: only the shortest pads
    assert split_decode_rows([], call_keys=160) == ([], [])
