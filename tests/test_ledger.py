"""The token ledger over random conversations (hypothesis): no trained token ever changes, the trained
count is the mask sum and the model-token count, and per-token versions survive turns."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedrl.envs.ledger import TokenLedger, encode

model_turn = st.tuples(
    st.just("model"),
    st.lists(st.integers(3, 90), min_size=1, max_size=6),
    st.integers(0, 9),  # policy version
)
text_turn = st.tuples(
    st.sampled_from(["tool", "env", "template"]),
    st.text(alphabet="0123456789+-*= abc<>/", min_size=0, max_size=12),
    st.just(-1),
)


@settings(max_examples=200, deadline=None)
@given(
    prompt=st.text(alphabet="0123456789+=", min_size=1, max_size=8),
    turns=st.lists(st.one_of(model_turn, text_turn), max_size=12),
)
def test_random_conversations_keep_every_trained_token(tokenizer, prompt, turns):
    ledger = TokenLedger()
    ledger.append_text(tokenizer, prompt, "prompt")
    appended_model: list[tuple[int, float, int]] = []  # (token, logprob, version) in order
    for kind, payload, version in turns:
        before = ledger.to_dict()
        if kind == "model":
            lps = [-0.01 * (i + 1) for i in range(len(payload))]
            ledger.append_model(payload, lps, [version] * len(payload))
            appended_model += [(t, lp, version) for t, lp in zip(payload, lps, strict=True)]
            ledger.next_turn()
        else:
            ids = ledger.append_text(tokenizer, payload, kind)
            assert ids == encode(tokenizer, payload)  # the suffix alone, tokenized on its own
        after = ledger.to_dict()
        for key in ("token_ids", "sources", "trained", "logprobs", "versions", "turns"):
            assert after[key][: len(before[key])] == before[key], f"{key} changed before the new suffix"
        lengths = {len(v) for k, v in after.items() if k != "turn"}
        assert lengths == {len(ledger)}, "a per-token list fell out of step with the tokens"
    trained = [
        (t, lp, v)
        for t, m, lp, v in zip(
            ledger.token_ids, ledger.trained, ledger.logprobs, ledger.versions, strict=True
        )
        if m
    ]
    assert trained == appended_model  # exactly the engine's tokens, log-probs and versions, in order
    assert ledger.num_model_tokens == sum(ledger.trained) == len(appended_model)
    assert all(s == "model" for s, m in zip(ledger.sources, ledger.trained, strict=True) if m)
    assert all(v == -1 for s, v in zip(ledger.sources, ledger.versions, strict=True) if s != "model")
    ids, mask, lps, vers = ledger.completion()
    assert len(ids) == len(mask) == len(lps) == len(vers) == len(ledger) - ledger.prompt_len
    assert sum(mask) == ledger.num_model_tokens
    again = TokenLedger.from_dict(ledger.to_dict())
    assert again == ledger


def test_turns_and_sources(tokenizer):
    ledger = TokenLedger()
    ledger.append_text(tokenizer, "12*34=", "prompt")
    ledger.append_model([10, 11], [-0.5, -0.25], [3, 3])
    ledger.next_turn()
    ledger.append_text(tokenizer, "408", "tool")
    ledger.append_model([12], [-0.1], [4])
    assert ledger.prompt_len == 6
    assert ledger.turns == [0] * 8 + [1] * 4
    assert [ledger.model_tokens_of_turn(t) for t in (0, 1)] == [2, 1]
    assert ledger.versions[-1] == 4 and ledger.versions[6:8] == [3, 3]


def test_bad_appends_are_clear_errors():
    ledger = TokenLedger()
    with pytest.raises(ValueError, match="2 ids, 1 log-probs and 2 versions"):
        ledger.append_model([1, 2], [-0.1], [0, 0])
    with pytest.raises(ValueError, match="append_model"):
        ledger.append_tokens([1], "model")
    with pytest.raises(ValueError, match="source must be one of"):
        ledger.append_tokens([1], "user")  # type: ignore[arg-type]
