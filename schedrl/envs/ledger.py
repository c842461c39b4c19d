"""The token ledger of a multi-turn trajectory: token in, token out, append only.

Every token of an episode sits in one list, in order, with what produced it:

    source    "prompt" | "model" | "tool" | "env" | "template" | "summary" (a folded segment's, as context)
              | "other" (another policy's turn: cross-policy sampling)
    trained   whether the loss sees it (model tokens only)
    logprob   the behaviour log-prob the engine sampled it with (0.0 for non-model tokens)
    version   the policy version that produced it (-1 for non-model tokens)
    turn      the turn it belongs to (0 = the prompt and the first model turn)

Model tokens arrive as ids, exactly as the engine sampled them; text from the environment,
a tool or a chat template is tokenized on its own and appended as a suffix. Nothing already
in the ledger is ever re-tokenized or rewritten, so the trained tokens and their log-probs are
the ones the engine produced (the re-tokenization drift of trl#5224 and verl#3960 cannot
happen), and the loss mask has exactly one entry per token (trl#5144 cannot happen).

Length penalties and the overlong rule count model tokens only (`num_model_tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Source = Literal["prompt", "model", "tool", "env", "template", "summary", "other"]
SOURCES: tuple[str, ...] = ("prompt", "model", "tool", "env", "template", "summary", "other")


def encode(tokenizer: Any, text: str) -> list[int]:
    """`text` as token ids on its own, with no special tokens added: how a suffix is tokenized."""
    return list(tokenizer(text, add_special_tokens=False).input_ids)


@dataclass
class TokenLedger:
    """One trajectory's tokens with their source, loss mask, behaviour log-prob, version and turn."""

    token_ids: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    turn: int = 0  # the current turn; `next_turn` starts the next one

    def __len__(self) -> int:
        return len(self.token_ids)

    def append_model(self, ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int]) -> None:
        """Tokens the policy sampled, with the engine's behaviour log-probs and per-token versions."""
        if not len(ids) == len(logprobs) == len(versions):
            raise ValueError(
                f"append_model: {len(ids)} ids, {len(logprobs)} log-probs and {len(versions)} versions"
            )
        self._extend(ids, "model", True, logprobs, versions)

    def append_tokens(self, ids: Sequence[int], source: Source) -> None:
        """Non-model tokens (never trained on): a prompt, a tool's output, the environment, a template."""
        if source == "model":
            raise ValueError("append_tokens: model tokens come with log-probs and versions (append_model)")
        if source not in SOURCES:
            raise ValueError(f"append_tokens: source must be one of {', '.join(SOURCES)}, got {source!r}")
        self._extend(ids, source, False, [0.0] * len(ids), [-1] * len(ids))

    def append_text(self, tokenizer: Any, text: str, source: Source) -> list[int]:
        """`text` tokenized as a suffix and appended (never trained on); returns its ids."""
        ids = encode(tokenizer, text)
        self.append_tokens(ids, source)
        return ids

    def next_turn(self) -> int:
        self.turn += 1
        return self.turn

    def _extend(self, ids: Sequence[int], source: str, trained: bool, logprobs, versions) -> None:
        n = len(ids)
        self.token_ids += [int(i) for i in ids]
        self.sources += [source] * n
        self.trained += [trained] * n
        self.logprobs += [float(x) for x in logprobs]
        self.versions += [int(v) for v in versions]
        self.turns += [self.turn] * n

    # ---- views ------------------------------------------------------------------------------
    @property
    def num_model_tokens(self) -> int:
        """Tokens the policy generated: what length penalties and the generation budget count."""
        return sum(self.trained)

    @property
    def prompt_len(self) -> int:
        """Tokens before the first model token (the initial prompt)."""
        return next((i for i, s in enumerate(self.sources) if s == "model"), len(self))

    @property
    def num_model_turns(self) -> int:
        """Turns holding at least one model token."""
        return len({t for t, m in zip(self.turns, self.trained, strict=True) if m})

    def model_tokens_of_turn(self, turn: int) -> int:
        return sum(1 for t, m in zip(self.turns, self.trained, strict=True) if t == turn and m)

    def completion(self) -> tuple[list[int], list[bool], list[float], list[int]]:
        """Everything after the prompt, as the learner takes it: ids, trained mask, behaviour log-probs and
        versions, one entry per token (tool and environment tokens are context, mask False)."""
        p = self.prompt_len
        return self.token_ids[p:], self.trained[p:], self.logprobs[p:], self.versions[p:]

    def to_dict(self) -> dict:
        return {
            "token_ids": self.token_ids,
            "sources": self.sources,
            "trained": self.trained,
            "logprobs": self.logprobs,
            "versions": self.versions,
            "turns": self.turns,
            "turn": self.turn,
        }

    @classmethod
    def from_dict(cls, d: dict) -> TokenLedger:
        lists = ("token_ids", "sources", "trained", "logprobs", "versions", "turns")
        return cls(*(list(d[k]) for k in lists), turn=int(d["turn"]))
