"""Chat-format prompts: a task's messages rendered by the tokenizer's chat template, token in.

A task with `messages` is encoded by `apply_chat_template(messages, add_generation_prompt=True)`
straight to token ids, so the engine's prompt is exactly the template's tokens (never the template
rendered to text and tokenized again, which can merge or split tokens at the seams). Plain tasks are
tokenized from their prompt string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from schedrl.envs.base import Task

ROLES = ("system", "user", "assistant", "tool")


def check_messages(messages: Any, where: str) -> tuple[dict[str, Any], ...]:
    """The messages as a tuple of dicts; a clear error naming `where` for anything else."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise ValueError(f"{where}: a chat prompt is a non-empty list of messages, got {messages!r:.80}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"{where}: message {i} must be {{role: ..., content: ...}}, got {m!r:.80}")
        if m["role"] not in ROLES:
            raise ValueError(
                f"{where}: message {i} has unknown role {m['role']!r} (known: {', '.join(ROLES)})"
            )
        out.append(dict(m))
    return tuple(out)


def readable(messages: Sequence[dict[str, Any]]) -> str:
    """A plain-text copy of a chat prompt, for logs and tables."""
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


def require_chat_template(tokenizer: Any) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the data has chat prompts (lists of messages) but the tokenizer has no chat template: "
            "set tokenizer.chat_template, or give prompts as strings"
        )


def prompt_ids(tokenizer: Any, task: Task) -> list[int]:
    """The token ids the model is prompted with for `task`."""
    if task.messages is None:
        return list(tokenizer(task.prompt).input_ids)
    require_chat_template(tokenizer)
    out = tokenizer.apply_chat_template(list(task.messages), add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out  # a BatchEncoding in transformers 5
    return [int(i) for i in ids]
