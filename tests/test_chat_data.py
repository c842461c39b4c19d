"""Chat-format data: message prompts rendered by the chat template, token in, token out."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from schedrl.config import config_from_dict
from schedrl.envs.chat import prompt_ids
from schedrl.envs.user import FileTask
from schedrl.models import build_char_tokenizer, build_tiny_model
from schedrl.rollout import group_requests
from schedrl.types import SamplingParams

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def correct(completions, answer, **kwargs):
    return [1.0 if c[0]["content"].strip() == a else 0.0 for c, a in zip(completions, answer, strict=True)]


def chat_rows(n: int = 40) -> list[dict]:
    return [
        {"prompt": [{"role": "user", "content": f"{a}+{b}="}], "answer": str(a + b), "id": f"q{a}{b}"}
        for a in range(n // 8)
        for b in range(8)
    ]


def bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A small BPE tokenizer trained here, whose post-processor adds <s> (as Llama's does)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    corpus = [f"<|user|>{a}+{b}=<|assistant|>{a + b}" for a in range(30) for b in range(30)] * 3
    corpus += ["the quick brown fox jumps over the lazy dog " * 4] * 50
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    from tokenizers import decoders

    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side="left",
        chat_template=TEMPLATE,
    )


def test_a_chat_prompt_is_the_templates_tokens_on_a_trained_bpe_tokenizer():
    tok = bpe_tokenizer()
    source = FileTask(rows=chat_rows(), reward=correct, eval_fraction=0.0)
    task = source.splits["train"][3]
    template_ids = tok.apply_chat_template(list(task.messages), add_generation_prompt=True, tokenize=True)
    template_ids = list(template_ids["input_ids"] if hasattr(template_ids, "keys") else template_ids)
    (request,) = group_requests([task], tok, SamplingParams(4), 1, seed=0, step=0)
    assert list(request.prompt_ids) == template_ids == prompt_ids(tok, task)
    assert template_ids.count(tok.bos_token_id) == 1
    # tokenizing the rendered text again would add a second <s>: the seam this avoids
    rendered = tok.apply_chat_template(list(task.messages), add_generation_prompt=True, tokenize=False)
    assert tok(rendered).input_ids != template_ids


def test_completion_tokens_reach_the_learner_as_the_engine_sampled_them(tmp_path, monkeypatch):
    """One training step on the BPE tokenizer: the learner's batch holds the engine's token ids, even
    where decoding and encoding again would give other tokens (BPE is not a bijection)."""
    from schedrl.orchestrate import build as build_mod
    from schedrl.orchestrate.sync import run_sync
    from schedrl.training.learner import Learner
    from schedrl.training.run_dir import RunDir

    tok = bpe_tokenizer()
    model = build_tiny_model(tok)
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    cfg = config_from_dict(
        {
            "steps": 1,
            "model": {"path": str(tmp_path / "model")},
            "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 12},
            "sft": {"steps": 0},
            "eval": {"tasks": 0},
        }
    )
    seen: dict = {}
    real_update = Learner.update

    def spy(self, batch, advantages, step, **kw):
        seen["batch"] = batch
        return real_update(self, batch, advantages, step, **kw)

    monkeypatch.setattr(Learner, "update", spy)
    source = FileTask(rows=chat_rows(), reward=correct, eval_fraction=0.0)
    c = build_mod.build(cfg, RunDir.create(tmp_path, "run"), source=source)
    real_generate = c.rollout.run

    def capture(requests, score, by_id):
        samples, stats = real_generate(requests, score, by_id)
        seen["samples"] = samples
        return samples, stats

    monkeypatch.setattr(c.rollout, "run", capture)
    run_sync(c)  # one step: cfg.steps is 1
    batch, samples = seen["batch"], seen["samples"]
    differs = 0
    for row, s in enumerate(samples):
        ids = batch.input_ids[row].tolist()
        n = len(s.prompt_ids) + len(s.token_ids)
        kept = [t for t, m in zip(ids, batch.attention_mask[row].tolist(), strict=True) if m][:n]
        assert kept == list(s.prompt_ids) + list(s.token_ids)
        differs += tok(tok.decode(s.token_ids), add_special_tokens=False).input_ids != list(s.token_ids)
    assert differs > 0, "no sample would have changed under decode and encode: the check proves nothing"
    c.logger.close()


def test_bad_chat_data_is_named():
    with pytest.raises(ValueError, match=r"no 'prompt' column; the columns are 'question', 'answer'"):
        FileTask(rows=[{"question": "1+1=", "answer": "2"}], reward=correct)
    with pytest.raises(ValueError, match=r"row 1: message 0 has unknown role 'robot'"):
        FileTask(rows=[{"prompt": "1+1="}, {"prompt": [{"role": "robot", "content": "hi"}]}], reward=correct)
    plain = build_char_tokenizer()
    plain.chat_template = None
    task = FileTask(rows=chat_rows(), reward=correct).tasks[0]
    with pytest.raises(ValueError, match="the tokenizer has no chat template"):
        prompt_ids(plain, task)


def test_the_tiny_tokenizer_renders_chat_offline():
    tok = build_char_tokenizer()
    text = tok.apply_chat_template(
        [
            {"role": "user", "content": "3+4="},
            {"role": "assistant", "content": "7"},
            {"role": "user", "content": "1+1="},
        ],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert text == "user: 3+4=\nassistant: 7</s>\nuser: 1+1=\nassistant: "
