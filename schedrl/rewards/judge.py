"""A generative judge as a reward function: a causal LM reads a prompt template filled with the sample,
answers greedily (temperature 0), and a parser turns its answer into a reward.

- **Template.** A text with `{completion}` and, as the judge needs them, `{prompt}` and `{answer}` (the
  task's reference answer); a chat
  prompt or completion fills in as its messages' contents. Any other field is refused when the judge is
  built.
- **Model.** A local causal LM directory, run on schedrl's built-in engine (continuous batching, greedy),
  `max_new_tokens` tokens a verdict; or `policy`, the policy being trained judging its own samples
  (self-rewarding): the engine that generated them lends the judge its model (`HFEngine.beside`), so
  verdicts come from the weights of the latest push, on the engine's device, between its steps. That
  engine is the synchronous loop's own, or an engine worker's with `pipeline.reward_placement:
  colocated` (built-in engine only).
- **Parser.** `score`: the first number in the verdict, clipped to `score_range` and mapped onto [0, 1];
  `choice`: the first of `choices`' words the verdict starts with (case and leading space ignored), worth
  its value (default `{yes: 1, no: 0}`).
- **Failures.** A verdict that does not parse scores 0 and is counted (`judge/parse_failure_rate`). Once
  `min_samples` verdicts are in, a failure rate above `max_parse_failure_rate` stops the run with a
  `JudgeError` that names the judge and shows a verdict that failed.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from schedrl.envs.scoring import RewardError

PARSERS = ("score", "choice")
POLICY = "policy"  # `judge: policy`: the policy's own model judges
FIELDS = ("prompt", "completion", "answer")
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


class JudgeError(RewardError):
    """Too many of a judge's verdicts did not parse: the run stops (a scorer lets it through)."""


def template_fields(template: str) -> list[str]:
    """The fields `template` names, each checked against FIELDS; `{completion}` required."""
    names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    unknown = sorted(set(names) - set(FIELDS))
    if unknown:
        raise ValueError(f"template: unknown field(s) {', '.join(unknown)}; known: {', '.join(FIELDS)}")
    if "completion" not in names:
        raise ValueError("template: needs the field {completion}, what the judge judges")
    return names


def parse_score(verdict: str, low: float, high: float) -> float | None:
    """The first number in `verdict`, clipped to [low, high], as a fraction of the range; None if none."""
    m = NUMBER.search(verdict)
    if m is None:
        return None
    x = min(max(float(m.group()), low), high)
    return (x - low) / (high - low)


def parse_choice(verdict: str, choices: Mapping[str, float]) -> float | None:
    """The value of the choice `verdict` starts with (longest first); None if it starts with none."""
    text = verdict.strip().lower()
    for word in sorted(choices, key=len, reverse=True):
        if text.startswith(word.lower()):
            return float(choices[word])
    return None


class Judge:
    """Rewards completions by a causal LM's greedy verdict (module doc)."""

    def __init__(
        self,
        path: str | Path,
        template: str,
        parser: str = "choice",
        choices: Mapping[str, float] | None = None,
        score_range: Sequence[float] = (0.0, 10.0),
        max_new_tokens: int = 8,
        max_parse_failure_rate: float = 0.2,
        min_samples: int = 32,
        max_concurrency: int = 32,
    ) -> None:
        from schedrl.models import load_model_and_tokenizer

        self.judges_policy = path == POLICY  # a directory of that name is written ./policy
        self.path = Path(path)
        where = f"judge {str(self.path)!r}"
        try:
            self.fields = template_fields(template)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        if parser not in PARSERS:
            raise ValueError(f"{where}: parser must be one of {', '.join(PARSERS)}, got {parser!r}")
        self.choices = dict(choices) if choices is not None else {"yes": 1.0, "no": 0.0}
        if not self.choices or not all(isinstance(k, str) and k.strip() for k in self.choices):
            raise ValueError(f"{where}: choices must map non-empty words to rewards, got {choices!r}")
        low, high = (float(x) for x in score_range)
        if not low < high:
            raise ValueError(f"{where}: score_range must be [low, high] with low < high, got {score_range!r}")
        if not 0.0 <= max_parse_failure_rate <= 1.0:
            raise ValueError(
                f"{where}: max_parse_failure_rate must be in [0, 1], got {max_parse_failure_rate!r}"
            )
        for field, value in (("max_new_tokens", max_new_tokens), ("min_samples", min_samples)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}: {field} must be a positive integer, got {value!r}")
        self.max_concurrency = max_concurrency
        self.engine: Any = None
        if not self.judges_policy:
            if not (self.path / "config.json").is_file():
                raise ValueError(f"{where}: not a model directory (no config.json)")
            model, tokenizer = load_model_and_tokenizer(str(self.path))
            self.bind(model, tokenizer)
        self.template, self.parser, self.range = template, parser, (low, high)
        self.max_new_tokens, self.max_failure_rate, self.min_samples = (
            max_new_tokens,
            max_parse_failure_rate,
            min_samples,
        )
        self.seen = self.failures = 0
        self.last_failure = ""
        self.__name__ = f"judge_{self.path.name}"  # the name its metrics go under

    def bind(self, model: Any, tokenizer: Any) -> None:
        """Judge with `model` (a judge's own), on an engine of its own."""
        from schedrl.engine.hf import EngineConfig, HFEngine

        self.tokenizer = tokenizer
        self.engine = HFEngine(model, tokenizer, EngineConfig(max_concurrency=self.max_concurrency))

    def bind_policy(self, engine: Any) -> None:
        """`judge: policy`: judge on the policy engine's model (`HFEngine.beside`), whose weights each
        push updates in place, so verdicts follow the policy."""
        from schedrl.engine.hf import EngineConfig

        self.tokenizer = engine.tokenizer
        self.engine = engine.beside(EngineConfig(max_concurrency=self.max_concurrency))

    def fill(self, prompt: Any, completion: Any, answer: Any = None) -> str:
        """The judge's prompt for one sample."""
        return self.template.format(
            prompt=plain_text(prompt), completion=plain_text(completion), answer=plain_text(answer)
        )

    def verdicts(self, texts: Sequence[str]) -> list[str]:
        """The judge's greedy answer to each text."""
        from schedrl.types import Request, SamplingParams

        if self.engine is None:
            raise RewardError(
                f"judge {POLICY!r} has no model: the policy judges on the engine that generated the samples; "
                "with pipeline.mode async, set pipeline.reward_placement: colocated (engine.backend: builtin)"
            )
        params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0)
        requests = [
            Request(id=f"judge-{i}", prompt_ids=tuple(self.tokenizer(t).input_ids), params=params)
            for i, t in enumerate(texts)
        ]
        samples = self.engine.generate(requests)
        return [str(self.tokenizer.decode(list(s.token_ids), skip_special_tokens=True)) for s in samples]

    def parse(self, verdict: str) -> float | None:
        if self.parser == "score":
            return parse_score(verdict, *self.range)
        return parse_choice(verdict, self.choices)

    @property
    def failure_rate(self) -> float:
        return self.failures / self.seen if self.seen else 0.0

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        answers = columns.get("answer") or [None] * len(prompts)
        if "answer" in self.fields and any(a is None for a in answers):
            raise ValueError(
                f"judge {str(self.path)!r}: its template uses {{answer}}, but a task has no answer"
            )
        verdicts = self.verdicts(
            [self.fill(p, c, a) for p, c, a in zip(prompts, completions, answers, strict=True)]
        )
        rewards = []
        for v in verdicts:
            parsed = self.parse(v)
            if parsed is None:
                self.last_failure = v
            rewards.append(0.0 if parsed is None else parsed)
            self.seen += 1
            self.failures += parsed is None
        if self.seen >= self.min_samples and self.failure_rate > self.max_failure_rate:
            raise JudgeError(
                f"judge {str(self.path)!r}: {self.failures} of {self.seen} verdicts did not parse as a "
                f"{self.parser} ({self.failure_rate:.2f} > max_parse_failure_rate {self.max_failure_rate}); "
                f"the last was {self.last_failure!r}"
            )
        return rewards

    def metrics(self) -> dict[str, float]:
        return {"judge/parse_failure_rate": self.failure_rate}


def plain_text(x: Any) -> str:
    """A prompt, completion or answer as plain text: a message list as its contents in order."""
    if x is None:
        return ""
    if isinstance(x, list):  # messages as plain text: their contents in order
        return "".join(str(m.get("content", "")) for m in x)
    return str(x)


def policy_judges(source: Any) -> list[Judge]:
    """The `judge: policy` judges among a task's rewards: its `task.reward_model`'s, its reward list's."""
    rewards = getattr(source, "rewards", None)
    found = [getattr(source, "model", None), *getattr(rewards, "funcs", ())]
    return [j for j in found if isinstance(j, Judge) and j.judges_policy]


def wants_policy_judge(task_reward_model: Any, task_args: Mapping[str, Any]) -> bool:
    """Whether a task's config names `judge: policy` (its reward_model, or an entry of its reward list)."""
    listed = task_args.get("reward")
    entries = [task_reward_model, *(listed if isinstance(listed, list) else [listed])]
    return any(isinstance(e, Mapping) and e.get("judge") == POLICY for e in entries)
