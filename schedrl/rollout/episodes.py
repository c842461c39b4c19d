"""Multi-turn episodes on the engine: the model's turns are engine requests, the environment's answers
(tool calls included) run on an event loop off the engine's thread.

Each episode keeps a `TokenLedger`. A model turn is a request whose prompt is the whole ledger so far
and whose budget is what is left of the episode's `max_new_tokens`; it stops at the call parser's
closing tag (a stop string). When it finishes, its tokens go into the ledger exactly as sampled and
the turn's text goes to `env.step` on the event loop; while the environment works the engine runs
the other episodes' turns. The answer is tokenized as a suffix and the next turn is admitted.

This is the `release` tool-wait policy of every peer: a waiting episode holds no engine slot, and
its next turn prefills its history again. Keeping the waiting episode's keys and values (`pin`) and
admitting returns first (`priority`) need the engine to park and extend a request; they are not
built yet.

Bad input ends an episode, never the run: an environment that raises, answers with the wrong type
or takes longer than `env_timeout_s` scores 0 and is counted (`env_errors`); a history that
outgrows the engine's context ends with finish reason "length".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from schedrl.engine import Engine
from schedrl.envs.base import Task
from schedrl.envs.environment import Environment, Observation, StepResult
from schedrl.envs.ledger import TokenLedger
from schedrl.envs.tools import clip_tokens
from schedrl.seeding import derive_seed
from schedrl.types import FinishReason, Request, Sample, task_of


@dataclass
class _Episode:
    request: Request  # the episode's own request: ids, seed, budget
    task: Task
    env: Environment
    ledger: TokenLedger = field(default_factory=TokenLedger)
    text: str = ""  # everything after the prompt, decoded
    reward: float = 0.0
    finish: FinishReason = "stop"
    done: bool = False


class EpisodeRunner:
    """Runs multi-turn episodes of `make_env()` environments on `engine`.

    `stop`: the stop strings of every model turn (the call parser's closing tag);
    `max_turns`: model turns per episode; `max_observation_tokens`: cap of each observation (head and
    tail kept)."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        make_env: Callable[[], Environment],
        stop: Sequence[str] = (),
        max_turns: int = 4,
        max_observation_tokens: int = 256,
        env_timeout_s: float = 60.0,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"EpisodeRunner.max_turns must be >= 1, got {max_turns!r}")
        if env_timeout_s <= 0:
            raise ValueError(f"EpisodeRunner.env_timeout_s must be > 0, got {env_timeout_s!r}")
        self.env_timeout_s = env_timeout_s  # a reset, step or close past this ends its episode, counted
        self.engine, self.tokenizer, self.make_env = engine, tokenizer, make_env
        self.stop, self.max_turns, self.max_obs = tuple(stop), max_turns, max_observation_tokens
        self.env_errors = 0
        self.last_turns: list[int] = []  # model turns of each episode of the last `run`
        self.tool_counts: Counter[str] = Counter()  # tool-call outcomes (ok, malformed, timeout, ...) so far
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="environments", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)

    def _submit(self, coro) -> concurrent.futures.Future:
        """Run an environment call on the loop, under `env_timeout_s`."""
        if not self.loop.is_running():
            coro.close()
            raise RuntimeError("EpisodeRunner is closed: its environments' event loop has stopped")
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, self.env_timeout_s), self.loop)

    def run(self, requests: Sequence[Request], tasks: dict[str, Task]) -> list[Sample]:
        """One episode per request (its task from `tasks`); the samples come back in request order, each
        with its reward, its ledger's completion and the trained mask of its tokens."""
        episodes = {r.id: _Episode(r, tasks[task_of(r)], self.make_env()) for r in requests}
        waiting: dict[concurrent.futures.Future, tuple[_Episode, str]] = {}  # env futures -> (episode, kind)
        for ep in episodes.values():
            waiting[self._submit(ep.env.reset(ep.task, ep.request.params.seed or 0))] = (ep, "reset")
        in_engine: dict[str, _Episode] = {}
        while waiting or in_engine:
            ready = [f for f in waiting if f.done()]
            if not ready and not in_engine:  # nothing to decode: wait for an environment
                done, _ = concurrent.futures.wait(
                    list(waiting), return_when=concurrent.futures.FIRST_COMPLETED
                )
                ready = list(done)
            for f in ready:
                ep, kind = waiting.pop(f)
                try:
                    self._on_env(ep, kind, f, in_engine)
                except Exception:  # a bad answer (wrong type, bad source, nothing to prompt with) ends it
                    self.env_errors += 1
                    ep.done, ep.reward = True, 0.0
            if in_engine:
                for s in self.engine.step():
                    ep = in_engine.pop(s.request_id)
                    self._on_model_turn(ep, s, waiting)
        for ep in episodes.values():
            try:
                self._submit(ep.env.close()).result()
            except Exception:  # a failing close must not lose the episodes
                self.env_errors += 1
        self.last_turns = [
            len({t for t, m in zip(ep.ledger.turns, ep.ledger.trained, strict=True) if m})
            for ep in episodes.values()
        ]
        return [self._sample(episodes[r.id]) for r in requests]

    # ---- events -----------------------------------------------------------------------------
    def _on_env(self, ep: _Episode, kind: str, future: concurrent.futures.Future, in_engine: dict) -> None:
        try:
            out = future.result()
        except Exception:  # the environment's failure ends its episode with reward 0, counted
            self.env_errors += 1
            ep.done, ep.reward = True, 0.0
            return
        if kind == "reset":
            if not isinstance(out, Observation):
                raise TypeError(f"reset returned {type(out).__name__}, not an Observation")
            ep.ledger.append_tokens(list(self.tokenizer(out.text).input_ids), "prompt")
        else:
            if not isinstance(out, StepResult):
                raise TypeError(f"step returned {type(out).__name__}, not a StepResult")
            self.tool_counts.update(out.info.get("tools", ()))
            ep.reward += out.reward or 0.0
            if out.done or out.truncated or out.observation is None:
                ep.done = True
                return
            ids = clip_tokens(self.tokenizer, out.observation.text, self.max_obs)
            ep.ledger.append_tokens(ids, out.observation.source)
            ep.text += self.tokenizer.decode(ids, skip_special_tokens=True)
            ep.ledger.next_turn()
        self._next_turn(ep, in_engine)

    def _next_turn(self, ep: _Episode, in_engine: dict) -> None:
        left = ep.request.params.max_new_tokens - ep.ledger.num_model_tokens
        if left <= 0 or ep.ledger.turn >= self.max_turns:
            ep.done, ep.finish = True, "length"
            return
        p = ep.request.params
        params = replace(
            p,
            max_new_tokens=left,
            stop_strings=tuple(dict.fromkeys((*p.stop_strings, *self.stop))),
            seed=derive_seed(p.seed, "turn", ep.ledger.turn),
        )
        turn = Request(
            f"{ep.request.id}/turn{ep.ledger.turn}",
            tuple(ep.ledger.token_ids),
            params,
            task_id=ep.request.task_id,
            group_id=ep.request.group_id,
            sample_index=ep.request.sample_index,
        )
        try:
            self.engine.add(turn)
        except ValueError:  # the history no longer fits the engine's context
            ep.done, ep.finish = True, "length"
            return
        in_engine[turn.id] = ep

    def _on_model_turn(self, ep: _Episode, s: Sample, waiting: dict) -> None:
        ep.ledger.append_model(s.token_ids, s.logprobs, s.versions)
        ep.text += s.text
        if s.finish_reason == "length" and ep.ledger.num_model_tokens >= ep.request.params.max_new_tokens:
            ep.finish = "length"
        waiting[self._submit(ep.env.step(s.text))] = (ep, "step")

    def _sample(self, ep: _Episode) -> Sample:
        ids, trained, logprobs, versions = ep.ledger.completion()
        r = ep.request
        return Sample(
            r.id,
            tuple(ep.ledger.token_ids[: ep.ledger.prompt_len]),
            tuple(ids),
            tuple(logprobs),
            tuple(versions),
            ep.finish,
            r.params,
            text=ep.text,
            task_id=r.task_id,
            group_id=r.group_id,
            sample_index=r.sample_index,
            reward=ep.reward,
            trained=tuple(trained),
        )
