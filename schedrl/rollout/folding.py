"""Context folding: an episode whose history outgrows a token budget has the model summarise it, and
goes on from the summary in a fresh context. Each context is a *segment*, trained as its own sequence;
the episode's reward (and advantage) is shared by all of its segments.

When the environment answers a turn and the history with that answer would pass `tokens`, the answer
waits: `ask` is appended and the model writes its summary (a model turn, trained, up to
`summary_tokens`, ended by `stop`). The segment ends there. The next one starts from the episode's prompt,
`carry`, the summary's tokens exactly as sampled, and the answer that waited; the episode's turns, budget
and rewards go on across segments.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fold:
    """`task.fold`: when and how an episode folds its history (checked when the config loads)."""

    tokens: int  # a segment's budget: the history with the next answer past this folds first
    ask: str = " note:"  # appended to the history: the model writes its summary after it ...
    stop: str = ";"  # ... ended by this
    summary_tokens: int = 16  # at most this many tokens of summary
    carry: str = " note:"  # in the next segment, between the episode's prompt and the summary
