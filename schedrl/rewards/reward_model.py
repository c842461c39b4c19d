"""A learned reward model as a reward function: a local `AutoModelForSequenceClassification` directory that
scores (prompt, completion) pairs, in batches, with its own tokenizer.

`RewardModel` is a reward function in TRL's batch shape (`f(prompts, completions, **columns)`), so it mixes
with rule rewards by weight wherever reward functions go: a file task's `reward` list (as
`{reward_model: DIR, ...}`), `schedrl.Trainer(reward_funcs=[rule, RewardModel(DIR)], reward_weights=...)`,
or TRL's `GRPOTrainer` shape. What it does, stated:

- **Text.** A chat prompt (a message list) is rendered with the reward model's own chat template, the
  completion as the assistant's turn; a string prompt is joined to the completion as plain text
  (`template: auto` picks by the prompt; `chat` or `plain` force one).
- **Truncation.** At most `max_length` tokens; `truncation: left` drops the start of the prompt (the
  completion, which is scored, is kept), `right` drops the end.
- **Score.** The head's single logit at the last non-padding token (transformers' sequence
  classification), as a float.
- **Normalisation.** `none`; `running`: minus the running mean over every score so far, over the running
  standard deviation (Welford; the first batch sets them), as TRL's and OpenRLHF's reward normalisers do;
  `group`: minus the mean over the call's samples of the same prompt, over their standard deviation (a
  prompt sampled once scores 0). GRPO's advantage normalises per group anyway; this puts the model's
  score on one scale before it is mixed with a rule reward by weight.

Bad input is refused naming the directory: a head that is not a single score (`num_labels` != 1), a
tokenizer without a pad token, a chat prompt for a tokenizer without a chat template.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from schedrl.rewards.judge import plain_text

TRUNCATION = ("left", "right")
TEMPLATES = ("auto", "chat", "plain")
NORMALIZE = ("none", "running", "group")


class RunningStats:
    """Mean and standard deviation of every value seen (Welford)."""

    def __init__(self) -> None:
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    def update(self, values: Sequence[float]) -> None:
        for x in values:
            self.n += 1
            delta = x - self.mean
            self.mean += delta / self.n
            self.m2 += delta * (x - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.n) if self.n > 1 else 1.0


class RewardModel:
    """Scores completions with a sequence-classification model (module doc)."""

    def __init__(
        self,
        path: str | Path,
        batch_size: int = 16,
        max_length: int = 512,
        truncation: str = "left",
        template: str = "auto",
        normalize: str = "none",
        device: str | None = None,
    ) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.path = Path(path)
        where = f"reward model {str(self.path)!r}"
        for field, value, allowed in (
            ("truncation", truncation, TRUNCATION),
            ("template", template, TEMPLATES),
            ("normalize", normalize, NORMALIZE),
        ):
            if value not in allowed:
                raise ValueError(f"{where}: {field} must be one of {', '.join(allowed)}, got {value!r}")
        for field, value in (("batch_size", batch_size), ("max_length", max_length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}: {field} must be a positive integer, got {value!r}")
        if not (self.path / "config.json").is_file():
            raise ValueError(f"{where}: not a model directory (no config.json)")
        self.model: Any = AutoModelForSequenceClassification.from_pretrained(self.path)
        labels = self.model.config.num_labels
        if labels != 1:
            raise ValueError(
                f"{where}: its head gives {labels} scores per sequence; a reward model gives one (num_labels=1)"
            )
        self.tokenizer: Any = AutoTokenizer.from_pretrained(self.path)
        if self.tokenizer.pad_token_id is None:
            raise ValueError(
                f"{where}: its tokenizer has no pad token; set one (e.g. pad_token = eos_token) and save it"
            )
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id  # where the last real token is
        self.tokenizer.truncation_side = truncation
        self.tokenizer.padding_side = "right"
        self.device = torch.device(device) if device else next(self.model.parameters()).device
        self.model.to(self.device).eval().requires_grad_(False)
        self.batch_size, self.max_length, self.template, self.normalize = (
            batch_size,
            max_length,
            template,
            normalize,
        )
        self.stats = RunningStats()
        self.__name__ = f"reward_model_{self.path.name}"  # the name its metrics go under

    def text(self, prompt: Any, completion: Any) -> str:
        """What the model reads for one sample."""
        chat = isinstance(prompt, list) if self.template == "auto" else self.template == "chat"
        if not chat:
            return plain_text(prompt) + plain_text(completion)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                f"reward model {str(self.path)!r}: a chat prompt, but its tokenizer has no chat template"
            )
        messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        reply = (
            completion
            if isinstance(completion, list)
            else [{"role": "assistant", "content": str(completion)}]
        )
        return str(self.tokenizer.apply_chat_template(messages + reply, tokenize=False))

    @torch.no_grad()
    def raw_scores(self, texts: Sequence[str]) -> list[float]:
        """The head's score of each text, `batch_size` texts a forward."""
        out: list[float] = []
        for i in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(
                list(texts[i : i + self.batch_size]),
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            logits = self.model(**enc).logits.float()
            out += logits[:, 0].tolist()
        return out

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        scores = self.raw_scores([self.text(p, c) for p, c in zip(prompts, completions, strict=True)])
        if self.normalize == "running":
            self.stats.update(scores)
            scores = [(s - self.stats.mean) / (self.stats.std + 1e-8) for s in scores]
        elif self.normalize == "group":
            groups: dict[str, list[int]] = {}
            for i, p in enumerate(prompts):
                groups.setdefault(repr(p), []).append(i)
            out = [0.0] * len(scores)
            for members in groups.values():
                stats = RunningStats()
                stats.update([scores[i] for i in members])
                for i in members:
                    out[i] = (scores[i] - stats.mean) / (stats.std + 1e-8) if stats.n > 1 else 0.0
            scores = out
        return scores
