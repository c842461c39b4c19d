"""Multi-turn episodes on the engine: the model's turns are engine requests, the environment's answers
(tool calls included) run on an event loop off the engine's thread.

Each episode keeps a `TokenLedger`. A model turn is a request whose prompt is the whole ledger so far
and whose budget is what is left of the episode's `max_new_tokens` (and at most `max_turn_tokens`);
it stops at the call parser's closing tag (a stop string). When it finishes, its tokens go into the
ledger exactly as sampled and the turn's text goes to `env.step` on the event loop; while the
environment works the engine runs the other episodes' turns. The answer is tokenized as a suffix and
the next turn is admitted: an admission event, ordered by the engine's admission policy.

What the waiting episode holds meanwhile is the `ToolWaitPolicy`'s decision (`tool_wait/`):
`release` frees its slot (the next turn prefills the history again), `pin` parks the slot's keys
and values for a time to live (the next turn prefills only the answer), `priority` admits the
returning turn ahead of fresh ones, and `lockstep` holds every answer until the batch has answered.

With `fold` (`schedrl.rollout.folding`), an answer that would take the history past the fold's token
budget waits while the model summarises; the episode goes on in a fresh context (a new ledger) from its
prompt and the summary, and each context is trained as a segment of the episode's sample. Sub-agents
likewise: an environment's answer may open a fresh context (`StepResult.context: branch`), whose turns
run until an answer closes it (`return`) and goes to the context it left.

With `cross` (AgentRL's cross-policy sampling), each model turn is sampled by another policy's engine
with probability p: its tokens enter the history as context (source "other", never trained), so the
trained policy explores from states it would not reach alone, and the episode's reward goes to its own
turns.

Bad input ends an episode, never the run: an environment that raises, answers with the wrong type
or takes longer than `env_timeout_s` scores 0 and is counted (`env_errors`); a history that
outgrows the engine's context ends with finish reason "length". Above `max_error_rate` errors per
ended episode (after `min_episodes`) the run stops with `EnvironmentFailure`: a broken environment
must not train a policy on zeros.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import sys
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from schedrl.engine import Engine, ParkingEngine, StepStats
from schedrl.envs.base import Task
from schedrl.envs.environment import Environment, Observation, StepResult
from schedrl.envs.ledger import TokenLedger
from schedrl.envs.sessions import close_pools, pool_metrics
from schedrl.envs.tools import clip_tokens
from schedrl.rollout.clock import WallClock
from schedrl.rollout.folding import Fold
from schedrl.rollout.tool_wait import Back, Release, ToolWaitPolicy, Turn
from schedrl.seeding import derive_seed
from schedrl.timeline import Recorder, engine_phases
from schedrl.types import FinishReason, Request, Sample, task_of

log = logging.getLogger(__name__)


@dataclass
class _Episode:
    request: Request  # the episode's own request: ids, seed, budget
    task: Task
    env: Environment
    ledger: TokenLedger = field(default_factory=TokenLedger)
    alone: bool = False  # every model turn the policy's (no cross-policy turn)
    text: str = ""  # everything after the prompt, decoded
    reward: float = 0.0
    turn_rewards: list[float] = field(default_factory=list)  # one per model turn the environment answered
    env_s: float = 0.0  # seconds the environment took on the episode's actions (its steps), on the clock
    finish: FinishReason = "stop"
    done: bool = False
    last_turn: str | None = None  # the id of its last model turn's request ...
    kept: bool = False  # ... and whether that request parks its keys and values
    started: float = 0.0
    ended: float = 0.0
    turn_wall: float = 0.0  # time.time() when its model turn went to the engine (the episode trace)
    suspended: bool = False  # cut (`suspend`): its answers wait, nothing of it is admitted
    cut: Sample | None = None  # the partial model turn an abort took out of the engine, to resume
    # context folding: the episode's prompt tokens, its closed segments, the model tokens and summary turns
    # spent in them, whether its model turn is a summary, and the answer that waits for it
    prompt_ids: list[int] = field(default_factory=list)
    segments: list[Sample] = field(default_factory=list)
    spent_tokens: int = 0
    folds: int = 0
    summarising: bool = False
    held: tuple[list[int], str] | None = None  # an answer waiting for its fold: ids, source
    # sub-agents: the contexts waiting for the one opened last to return, with their prompts
    parents: list[tuple[TokenLedger, list[int]]] = field(default_factory=list)
    # cross-policy sampling: whether its turn in flight is the other policy's, and that policy's share
    on_other: bool = False
    other_tokens: int = 0
    other_turns: int = 0

    @property
    def model_tokens(self) -> int:
        """Model tokens of the whole episode: its closed segments', its waiting contexts' and its ledger's."""
        waiting = sum(ledger.num_model_tokens for ledger, _ in self.parents)
        return self.spent_tokens + waiting + self.ledger.num_model_tokens + self.other_tokens


@dataclass
class _Pending:
    """An environment call in flight."""

    ep: _Episode
    kind: str  # "reset" | "step"
    submitted: float
    wall: float = 0.0  # time.time() at submission, and at the answer (for the episode trace)
    answered: float = 0.0


class EnvironmentFailure(RuntimeError):
    """The environments failed on more episodes than the run allows."""


class EnvironmentsStuck(EnvironmentFailure):
    """The environments' event loop (the tool executor) has not run for longer than `env_timeout_s`:
    something blocks its thread, where no per-call timeout can fire."""


HEARTBEAT_S = 0.5  # how often the environments' event loop marks that it runs


class EpisodeRunner:
    """Runs multi-turn episodes of `make_env()` environments on `engine`.

    `stop`: the stop strings of every model turn (the call parser's closing tag);
    `max_turns`: model turns per episode; `max_observation_tokens`: cap of each observation (head and
    tail kept); `max_turn_tokens`: budget of one model turn (None: what is left of the episode's);
    `tool_wait`: what a waiting episode holds (default `release`); `clock`: wall or virtual time."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        make_env: Callable[[], Environment],
        stop: Sequence[str] = (),
        max_turns: int = 4,
        max_observation_tokens: int = 256,
        env_timeout_s: float = 60.0,
        max_turn_tokens: int | None = None,
        tool_wait: ToolWaitPolicy | None = None,
        clock: Any = None,
        max_error_rate: float = 0.05,
        min_episodes: int = 50,
        fold: Fold | None = None,
        cross: tuple[Engine, float] | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"EpisodeRunner.max_turns must be >= 1, got {max_turns!r}")
        if env_timeout_s <= 0:
            raise ValueError(f"EpisodeRunner.env_timeout_s must be > 0, got {env_timeout_s!r}")
        self.env_timeout_s = env_timeout_s  # a reset, step or close past this ends its episode, counted
        self.engine, self.tokenizer, self.make_env = engine, tokenizer, make_env
        self.stop, self.max_turns, self.max_obs = tuple(stop), max_turns, max_observation_tokens
        if max_turn_tokens is not None and max_turn_tokens < 1:
            raise ValueError(f"EpisodeRunner.max_turn_tokens must be >= 1, got {max_turn_tokens!r}")
        self.max_turn_tokens = max_turn_tokens
        self.fold = fold  # context folding: None keeps every episode in one context
        # cross-policy sampling: another policy's engine and the share of model turns it samples
        self.other, self.cross_p = cross if cross is not None else (None, 0.0)
        if self.other is not None and not 0.0 < self.cross_p <= 1.0:
            raise ValueError(f"EpisodeRunner cross-policy share must be in (0, 1], got {self.cross_p!r}")
        self.other_turns = 0  # model turns the other policy sampled so far
        self.folds = 0  # summaries written so far (each closed a segment)
        self.tool_wait = tool_wait if tool_wait is not None else Release()
        self.clock = clock if clock is not None else WallClock()
        if self.tool_wait.parks and not isinstance(engine, ParkingEngine):
            raise ValueError(
                f"tool-wait policy {type(self.tool_wait).__name__} keeps keys and values during waits, "
                f"which {type(engine).__name__} cannot (it is not a ParkingEngine); use release or priority"
            )
        self.env_errors = 0
        self._step_s: deque[float] = deque(maxlen=16)  # the latest engine steps' durations (on self.clock)
        self.episodes_ended = 0
        self.discarded = 0  # episodes ended for good without a sample (`discard`)
        if not 0 <= max_error_rate <= 1:
            raise ValueError(f"EpisodeRunner.max_error_rate must be in [0, 1], got {max_error_rate!r}")
        self.max_error_rate, self.min_episodes = max_error_rate, min_episodes
        self.last_env_error: str | None = None
        self.last_latencies: list[float] = []  # seconds from reset to the end, per episode of the last `run`
        self.peak_cached_tokens = 0  # most tokens the engine held keys and values for, in the last `run`
        # engine work of the last `run`: prefill_tokens, kv_reused_tokens, kv_evicted, peak_cached_tokens
        self.last_stats: dict[str, float] = {}
        self.last_turns: list[int] = []  # model turns of each episode of the last `run`
        self.tool_counts: Counter[str] = Counter()  # tool-call outcomes (ok, malformed, timeout, ...) so far
        self._active: dict[str, _Episode] = {}  # episodes started and not ended, by request id
        self._waiting: dict[concurrent.futures.Future, _Pending] = {}  # environment calls in flight
        self._in_engine: dict[str, _Episode] = {}  # model-turn request id -> its episode
        self._ended: list[_Episode] = []  # ended since the last `advance` returned
        self._closing: list[concurrent.futures.Future] = []  # environments' `close` calls in flight
        self.timeline: Recorder | None = None  # set: each episode's turns and calls as spans of its own
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="environments", daemon=True)
        self._beat = time.monotonic()  # when the loop last ran a callback: its heartbeat
        self.loop.call_soon(self._heartbeat)
        self._thread.start()

    def _heartbeat(self) -> None:
        self._beat = time.monotonic()
        self.loop.call_later(HEARTBEAT_S, self._heartbeat)

    def _wait(self, futures: Sequence[concurrent.futures.Future], return_when: str) -> None:
        """Wait for environment calls as `concurrent.futures.wait` does, but never on a loop that has stopped
        beating: an environment that blocks the loop's thread (a synchronous sleep, a CPU loop or a blocking
        socket inside an `async` reset, step or close) starves every per-call timeout, so past
        `env_timeout_s` without a heartbeat the run stops with `EnvironmentsStuck` and the loop's stack."""
        while True:
            done, pending = concurrent.futures.wait(futures, timeout=HEARTBEAT_S * 2, return_when=return_when)
            if not pending or (done and return_when == concurrent.futures.FIRST_COMPLETED):
                return
            silent = time.monotonic() - self._beat
            if silent > self.env_timeout_s:
                frame = sys._current_frames().get(self._thread.ident or -1)
                where = "".join(traceback.format_stack(frame)) if frame is not None else "(it has ended)"
                raise EnvironmentsStuck(
                    f"stuck: the tool executor (the environments' event loop, thread "
                    f"{self._thread.name!r}) has not run for {silent:.0f} s, past task.env_timeout_s="
                    f"{self.env_timeout_s:g}; an environment blocks it (a synchronous call inside an async "
                    f"reset, step or close: use `await asyncio.to_thread(...)`); where it is:\n{where}"
                )

    def close(self) -> None:
        """Wait for the environments still closing (each under `env_timeout_s`), then stop the loop."""
        if self._closing:
            try:
                self._wait(self._closing, concurrent.futures.ALL_COMPLETED)
            except EnvironmentsStuck as err:  # closing anyway: the loop's thread is a daemon, left behind
                log.warning("%s", err)
            self._check_closed()
        if self.loop.is_running():
            try:  # the per-episode sessions kept warm (`schedrl.envs.sessions`) end with the loop
                self._submit(close_pools()).result()
            except Exception as err:
                log.warning("closing the session pools: %s: %s", type(err).__name__, err)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)

    def _submit(self, coro) -> concurrent.futures.Future:
        """Run an environment call on the loop, under `env_timeout_s`."""
        if not self.loop.is_running():
            coro.close()
            raise RuntimeError("EpisodeRunner is closed: its environments' event loop has stopped")
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, self.env_timeout_s), self.loop)

    def run(self, requests: Sequence[Request], tasks: dict[str, Task], alone: bool = False) -> list[Sample]:
        """One episode per request (its task from `tasks`); the samples come back in request order, each
        with its reward, its ledger's completion and the trained mask of its tokens. `alone`: every model
        turn is the policy's, even with cross-policy sampling (a held-out evaluation judges the policy)."""
        before = self._engine_counters()
        self.peak_cached_tokens = 0
        episodes = self.start(requests, tasks, alone)
        while any(not ep.done for ep in episodes):
            self.advance()
        self._wait(self._closing, concurrent.futures.ALL_COMPLETED)  # every environment of the batch is
        self._check_closed()  # closed before the samples go out
        self.last_latencies = [ep.ended - ep.started for ep in episodes]
        after = self._engine_counters()
        self.last_stats = {k: float(after[k] - before[k]) for k in after}
        self.last_stats["peak_cached_tokens"] = float(self.peak_cached_tokens)
        samples = [self.sample(ep) for ep in episodes]
        self.last_turns = [sum(x.num_model_turns for x in s.rows()) for s in samples]
        return samples

    # ---- incremental: what `run` is made of, and what an engine worker drives ------------------
    def start(
        self, requests: Sequence[Request], tasks: dict[str, Task], alone: bool = False
    ) -> list[_Episode]:
        """Begin one episode per request (reset on the event loop); `advance` moves them on. `alone`: no
        turn of these episodes goes to the other policy."""
        new = []
        for r in requests:
            if r.id in self._active:
                raise ValueError(f"episode {r.id!r} is already running")
            ep = _Episode(r, tasks[task_of(r)], self.make_env(), alone=alone)
            ep.started = self.clock.now()
            self._active[r.id] = ep
            new.append(ep)
            self._call(ep, "reset", ep.env.reset(ep.task, r.params.seed or 0))
        return new

    def has_unfinished(self) -> bool:
        """Whether an episode that is not suspended still runs."""
        return any(not ep.suspended for ep in self._active.values())

    def advance(self) -> list[_Episode]:
        """Hand over the environments' answers that arrived, run one engine step; returns the episodes that
        ended. With nothing to decode it waits for the first answer (every answer, under lockstep)."""
        waiting = {f: p for f, p in self._waiting.items() if not p.ep.suspended}
        now = self.clock.now()
        arrivals = {f: self.clock.arrival(p.submitted, f) for f, p in waiting.items() if f.done()}
        ready = sorted((f for f, t in arrivals.items() if t <= now), key=arrivals.__getitem__)
        lockstep = self.tool_wait.lockstep
        if lockstep and (self._in_engine or len(ready) < len(waiting)):
            ready = []  # the batch moves on together, once every environment has answered
        if not ready and not self._in_engine:  # nothing to decode: wait for the environments
            if waiting:
                self._idle(waiting, arrivals, lockstep)
            return self._collect_ended()
        for f in ready:
            p = self._waiting.pop(f)
            try:
                self._on_env(p, f)
            except Exception as err:  # a bad answer (wrong type, bad source, nothing to prompt with) ends it
                self._env_error(p.ep, f"{p.kind}", err)
                self._end(p.ep, 0.0)
        if any(not ep.on_other for ep in self._in_engine.values()):
            started = self.clock.now()
            finished = self.engine.step()
            self.clock.charge(getattr(self.engine, "last_step", StepStats()))
            self._step_s.append(self.clock.now() - started)
            self.peak_cached_tokens = max(
                self.peak_cached_tokens, getattr(self.engine, "num_cached_tokens", 0)
            )
            for s in finished:
                self._on_model_turn(self._in_engine.pop(s.request_id), s)
        if self.other is not None and any(ep.on_other for ep in self._in_engine.values()):
            for s in self.other.step():
                self._on_model_turn(self._in_engine.pop(s.request_id), s)
        self._check_closed()
        self._check_error_rate()
        return self._collect_ended()

    def _env_error(self, ep: _Episode | None, call: str, err: BaseException) -> None:
        self.env_errors += 1
        what = f"episode {ep.request.id!r} " if ep is not None else ""
        kind = "timed out" if isinstance(err, TimeoutError) else f"{type(err).__name__}: {err}"
        self.last_env_error = f"{what}{call}: {kind}"

    def _check_error_rate(self) -> None:
        rate = self.env_errors / max(1, self.episodes_ended)
        if self.episodes_ended >= self.min_episodes and rate > self.max_error_rate:
            raise EnvironmentFailure(
                f"the environment failed {self.env_errors} times in {self.episodes_ended} episodes "
                f"({rate:.1%}), above task.max_env_error_rate={self.max_error_rate}; last error: "
                f"{self.last_env_error}"
            )

    def suspend(self, episode_id: str) -> _Episode:
        """Cut an episode: its model turn leaves the engine (kept, to resume from), its environment's answer
        waits; nothing of it runs until `resume`."""
        ep = self._active[episode_id]
        ep.suspended = True
        if ep.last_turn in self._in_engine:
            del self._in_engine[ep.last_turn]
            ep.cut = self._engine_of(ep).abort(ep.last_turn)
            ep.kept = False  # an aborted request does not park
        return ep

    def resume(self, episode_id: str) -> None:
        """Go on with a suspended episode exactly where it was cut (a cut turn from its tokens)."""
        ep = self._active[episode_id]
        ep.suspended = False
        if ep.cut is not None:
            turn = Request.resume(ep.cut)
            ep.cut = None
            self._engine_of(ep).add(turn)
            self._in_engine[turn.id] = ep

    def discard(self, episode_id: str) -> _Episode | None:
        """End an episode for good, with no sample (tail batching abandons spares so): its model turn leaves
        the engine, an environment call in flight is let go and its answer dropped, its environment closes.
        Not counted as ended: it neither scores nor counts towards the environments' error rate."""
        ep = self._active.pop(episode_id, None)
        if ep is None:
            return None
        ep.done = ep.suspended = True
        self.discarded += 1
        if ep.last_turn in self._in_engine:
            del self._in_engine[ep.last_turn]
            self._engine_of(ep).abort(ep.last_turn)
        elif ep.kept and ep.last_turn is not None and isinstance(self.engine, ParkingEngine):
            self.engine.evict(ep.last_turn)  # parked on a tool call: its keys and values go
        for f in [f for f, p in self._waiting.items() if p.ep is ep]:
            del self._waiting[f]
            f.cancel()
        try:
            self._closing.append(self._submit(ep.env.close()))
        except Exception as err:  # a close that cannot even start
            self._env_error(ep, "close", err)
        return ep

    def is_suspended(self, episode_id: str) -> bool:
        ep = self._active.get(episode_id)
        return ep is not None and ep.suspended

    def in_engine_ids(self) -> list[str]:
        """Episodes with a model turn in the engine."""
        return [ep.request.id for ep in self._in_engine.values()]

    def waiting_ids(self) -> list[str]:
        """Episodes (not suspended) waiting on their environment."""
        busy = {ep.request.id for ep in self._in_engine.values()}
        return [i for i, ep in self._active.items() if not ep.suspended and i not in busy]

    def _collect_ended(self) -> list[_Episode]:
        ended = self._ended
        self._ended = []
        return ended

    def _check_closed(self) -> None:
        for f in [f for f in self._closing if f.done()]:
            self._closing.remove(f)
            err = f.exception()
            if err is not None:  # a failing close must not lose the episodes
                self._env_error(None, "close", err)

    def counters(self) -> dict[str, float]:
        """Cumulative counts since the runner started: its engine's (`prefill_tokens`, `kv_reused_tokens`,
        `kv_evicted`, `kv_expired`), environment errors, each tool-call outcome (`tool/<outcome>`) and
        the session pools' (`session/*`): what an engine worker reports to the asynchronous pipeline."""
        return {
            **{k: float(v) for k, v in self._engine_counters().items()},
            "env_errors": float(self.env_errors),
            **{f"tool/{k}": float(v) for k, v in self.tool_counts.items()},
            **pool_metrics(),
            **self.context_counters(),
        }

    def context_counters(self) -> dict[str, float]:
        """Cumulative: summaries written (`fold/summaries`) and turns the other policy sampled
        (`cross/other_turns`), for the runs that fold or sample across policies."""
        return {
            **({"fold/summaries": float(self.folds)} if self.fold is not None else {}),
            **({"cross/other_turns": float(self.other_turns)} if self.other is not None else {}),
        }

    def _engine_counters(self) -> dict[str, int]:
        names = {"prefill_tokens": "num_prefill_tokens", "kv_reused_tokens": "num_reused"}
        names.update(kv_evicted="num_evicted", kv_expired="num_expired")
        return {k: int(getattr(self.engine, n, 0)) for k, n in names.items()}

    # ---- events -----------------------------------------------------------------------------
    def _call(self, ep: _Episode, kind: str, coro) -> None:
        f = self._submit(coro)
        pending = _Pending(ep, kind, self.clock.now(), time.time())
        f.add_done_callback(lambda _f: setattr(pending, "answered", time.time()))
        if self.clock.virtual:  # answers at once, with their latency: wait for it so runs are deterministic
            self._wait([f], concurrent.futures.ALL_COMPLETED)
        self._waiting[f] = pending

    def _took(self, p: _Pending, future: concurrent.futures.Future) -> float:
        """How long an environment call took: its latency on a virtual clock, else submitted to answered."""
        if self.clock.virtual:
            return self.clock.arrival(p.submitted, future) - p.submitted
        return max(0.0, (p.answered or time.time()) - p.wall)

    @property
    def _tracing(self) -> bool:
        return self.timeline is not None and not self.clock.virtual

    def _trace_env(self, p: _Pending, statuses: tuple = ()) -> None:
        """The call's span (submitted to answered) and the answer's wait for the runner to take it."""
        if not self._tracing:
            return
        assert self.timeline is not None
        now = time.time()
        answered = p.answered or now
        name = p.kind + (" " + ",".join(map(str, statuses)) if statuses else "")
        self.timeline.add("env", p.wall, answered, track=p.ep.request.id, name=name)
        if now - answered > 1e-4:
            self.timeline.add("answer-wait", answered, now, track=p.ep.request.id, name="answer waits")

    def _idle(self, waiting: dict, arrivals: dict, lockstep: bool) -> None:
        if self.clock.virtual:
            if arrivals:
                self.clock.jump(max(arrivals.values()) if lockstep else min(arrivals.values()))
            return
        until = concurrent.futures.ALL_COMPLETED if lockstep else concurrent.futures.FIRST_COMPLETED
        self._wait(list(waiting), until)

    def _end(self, ep: _Episode, reward: float | None = None) -> None:
        if ep.done:  # ended already (a failure found after the end overrules its reward)
            if reward is not None:
                ep.reward, ep.turn_rewards = reward, []
            return
        ep.done, ep.ended = True, self.clock.now()
        self.episodes_ended += 1
        self._active.pop(ep.request.id, None)
        self._ended.append(ep)
        try:
            self._closing.append(self._submit(ep.env.close()))
        except Exception as err:  # a close that cannot even start
            self._env_error(ep, "close", err)
        if reward is not None:  # the episode's reward is overruled (a failure scores 0): so are its turns'
            ep.reward, ep.turn_rewards = reward, []
        if ep.kept and ep.last_turn is not None and isinstance(self.engine, ParkingEngine):
            self.engine.evict(ep.last_turn)

    def _on_env(self, p: _Pending, future: concurrent.futures.Future) -> None:
        ep = p.ep
        try:
            out = future.result()
        except Exception as err:  # the environment's failure ends its episode with reward 0, counted
            self._trace_env(p, ("failed",))
            self._env_error(ep, p.kind, err)
            self._end(ep, 0.0)
            return
        self._trace_env(p, tuple(out.info.get("tools", ())) if isinstance(out, StepResult) else ())
        priority = 0.0
        if p.kind == "reset":
            if not isinstance(out, Observation):
                raise TypeError(f"reset returned {type(out).__name__}, not an Observation")
            ep.prompt_ids = list(self.tokenizer(out.text).input_ids)
            ep.ledger.append_tokens(ep.prompt_ids, "prompt")
        else:
            if not isinstance(out, StepResult):
                raise TypeError(f"step returned {type(out).__name__}, not a StepResult")
            statuses = tuple(out.info.get("tools", ()))
            self.tool_counts.update(statuses)
            ep.env_s += self._took(p, future)
            ep.reward += out.reward or 0.0
            ep.turn_rewards.append(float(out.reward or 0.0))
            if out.done or out.truncated or out.observation is None:
                self._end(ep)
                return
            if out.context == "branch":
                self._branch(ep, out.observation.text)
                return
            if out.context == "return":
                self._return(ep)
            ids = clip_tokens(self.tokenizer, out.observation.text, self.max_obs)
            ep.text += self.tokenizer.decode(ids, skip_special_tokens=True)
            if self._folds_before(ep, ids):  # the answer waits for the summary, then opens a segment
                ep.held = (ids, out.observation.source)
                self._summarise(ep)
                return
            ep.ledger.append_tokens(ids, out.observation.source)
            ep.ledger.next_turn()
            back = Back(
                ep.request.id,
                ep.ledger.turn,
                self.max_turns,
                len(ep.ledger),
                self.clock.now() - p.submitted,
                statuses,
                ep.ledger.num_model_tokens,
            )
            self.tool_wait.observe(back)
            priority = self.tool_wait.priority(back)
        self._next_turn(ep, priority)

    def _branch(self, ep: _Episode, prompt: str) -> None:
        """A sub-agent: a fresh context whose prompt is `prompt`; the current one waits for its return."""
        self._forget_parked(ep)  # the new context does not extend this one
        ep.parents.append((ep.ledger, ep.prompt_ids))
        ep.prompt_ids = list(self.tokenizer(prompt).input_ids)
        ep.text += prompt
        ep.ledger = TokenLedger(turn=ep.ledger.turn + 1)
        ep.ledger.append_tokens(ep.prompt_ids, "prompt")
        self._next_turn(ep)

    def _return(self, ep: _Episode) -> None:
        """Close the sub-agent's context (a segment) and go back to the one it left."""
        if not ep.parents:
            raise ValueError("the environment returned from a sub-agent, but none is open")
        self._forget_parked(ep)
        self._close_segment(ep)
        turn = ep.ledger.turn
        ep.ledger, ep.prompt_ids = ep.parents.pop()
        ep.ledger.turn = turn  # turns go on across contexts: the next model turn is the next one

    def _engine_of(self, ep: _Episode) -> Engine:
        """The engine of the episode's model turn in flight (or last)."""
        return self.other if ep.on_other and self.other is not None else self.engine

    def _crosses(self, ep: _Episode) -> bool:
        """Whether the episode's next model turn is the other policy's (seeded: a rerun draws the same)."""
        if self.other is None or ep.summarising or ep.alone:
            return False
        return (
            random.Random(derive_seed(ep.request.params.seed, "cross", ep.ledger.turn)).random()
            < self.cross_p
        )

    def _forget_parked(self, ep: _Episode) -> None:
        if ep.kept and ep.last_turn is not None and isinstance(self.engine, ParkingEngine):
            self.engine.evict(ep.last_turn)
        ep.kept = False

    def _close_segment(self, ep: _Episode) -> None:
        ep.segments.append(self._segment(ep, ep.ledger))
        ep.spent_tokens += ep.ledger.num_model_tokens

    def _folds_before(self, ep: _Episode, answer: list[int]) -> bool:
        """Whether the history with `answer` passes the fold's budget (and the segment has a model turn)."""
        f = self.fold
        return f is not None and ep.ledger.num_model_tokens > 0 and len(ep.ledger) + len(answer) > f.tokens

    def _summarise(self, ep: _Episode) -> None:
        """The summary turn: the fold's ask after the history, then the model's summary."""
        assert self.fold is not None
        ep.ledger.next_turn()
        ep.text += self.fold.ask
        ep.ledger.append_text(self.tokenizer, self.fold.ask, "template")
        left = ep.request.params.max_new_tokens - ep.model_tokens
        if left <= 0:
            ep.finish = "length"
            self._end(ep)
            return
        ep.summarising = True
        self._add_turn(ep, min(left, self.fold.summary_tokens), (self.fold.stop,), 0.0, 0.0)

    def _open_segment(self, ep: _Episode, summary: Sample) -> None:
        """Close the episode's segment after its summary; the next starts from the prompt, the summary and
        the answer that waited, and its first model turn follows."""
        assert self.fold is not None and ep.held is not None
        ep.summarising = False
        ep.turn_rewards.append(0.0)  # the summary turn earns nothing itself: it shares the episode's reward
        self._close_segment(ep)
        ep.folds += 1
        self.folds += 1
        self._forget_parked(ep)  # the next context does not extend this one
        ids, source = ep.held
        ep.held = None
        ledger = TokenLedger(turn=ep.ledger.turn + 1)
        ledger.append_tokens(ep.prompt_ids, "prompt")
        if self.fold.carry:
            ledger.append_text(self.tokenizer, self.fold.carry, "template")
        ledger.append_tokens(summary.token_ids, "summary")
        ledger.append_tokens(ids, source)  # type: ignore[arg-type]
        ep.ledger = ledger
        self._next_turn(ep)

    def _segment(self, ep: _Episode, ledger: TokenLedger) -> Sample:
        """A context of the episode as a segment: a sequence of its own, rewarded with the episode."""
        ids, trained, logprobs, versions = ledger.completion()
        r, p = ep.request, ledger.prompt_len
        return Sample(
            f"{r.id}/segment{len(ep.segments)}",
            tuple(ledger.token_ids[:p]),
            tuple(ids),
            tuple(logprobs),
            tuple(versions),
            "stop",
            r.params,
            task_id=r.task_id,
            group_id=r.group_id,
            sample_index=r.sample_index,
            trained=tuple(trained),
            turns=tuple(ledger.turns[p:]),
        )

    def _next_turn(self, ep: _Episode, priority: float = 0.0) -> None:
        left = ep.request.params.max_new_tokens - ep.model_tokens
        if left <= 0 or ep.ledger.turn - ep.folds >= self.max_turns:
            ep.finish = "length"
            self._end(ep)
            return
        step_s = max(self._step_s, default=0.0)
        keep_s = self.tool_wait.keep_s(
            Turn(ep.request.id, ep.ledger.turn, self.max_turns, len(ep.ledger), step_s)
        )
        budget = min(left, self.max_turn_tokens or left)
        self._add_turn(
            ep, budget, tuple(dict.fromkeys((*ep.request.params.stop_strings, *self.stop))), priority, keep_s
        )

    def _add_turn(
        self, ep: _Episode, budget: int, stops: tuple[str, ...], priority: float, keep_s: float
    ) -> None:
        """A model turn of `ep` to the engine (or the other policy's): the whole ledger as its prompt."""
        ep.on_other = self._crosses(ep)
        if ep.on_other:  # another model: nothing parked for it, and the policy's parked turn goes
            self._forget_parked(ep)
            keep_s = 0.0
        p = ep.request.params
        params = replace(
            p, max_new_tokens=budget, stop_strings=stops, seed=derive_seed(p.seed, "turn", ep.ledger.turn)
        )
        turn = Request(
            f"{ep.request.id}/turn{ep.ledger.turn}",
            tuple(ep.ledger.token_ids),
            params,
            priority=priority,
            task_id=ep.request.task_id,
            group_id=ep.request.group_id,
            sample_index=ep.request.sample_index,
            program=ep.request.id,
            keep_kv_s=keep_s,
            continues=ep.last_turn if ep.kept else None,
        )
        try:
            self._engine_of(ep).add(turn)
        except ValueError:  # the history no longer fits the engine's context
            ep.finish = "length"
            self._end(ep)
            return
        ep.last_turn, ep.kept = turn.id, keep_s > 0
        ep.turn_wall = time.time()
        self._in_engine[turn.id] = ep

    def _on_model_turn(self, ep: _Episode, s: Sample) -> None:
        if self._tracing:
            assert self.timeline is not None
            now, name = time.time(), f"turn {ep.ledger.turn} ({len(s.token_ids)} tokens)"
            self.timeline.add("turn", ep.turn_wall, now, track=ep.request.id, name=name)
            for kind, start, end in engine_phases(s.timings, ep.turn_wall, now):
                self.timeline.add(kind, start, end, track=ep.request.id, name=kind)
        if ep.on_other:  # the other policy's turn: context for the trained one
            ep.ledger.append_tokens(s.token_ids, "other")
            ep.other_tokens += len(s.token_ids)
            ep.other_turns += 1
            self.other_turns += 1
        else:
            ep.ledger.append_model(s.token_ids, s.logprobs, s.versions)
        ep.text += s.text
        if s.finish_reason == "length" and ep.model_tokens >= ep.request.params.max_new_tokens:
            ep.finish = "length"
        if ep.summarising:  # a summary goes to the next segment, not to the environment
            self._open_segment(ep, s)
            return
        self._call(ep, "step", ep.env.step(s.text))

    def sample(self, ep: _Episode) -> Sample:
        """The episode as a training sample: its last context's tokens after its prompt, with the reward,
        mask and turns of the whole episode; its other contexts (folded, or left for a sub-agent) are its
        segments. A context with no tokens after its prompt (a sub-agent that never got a turn) is none."""
        # an episode that ended inside a sub-agent: the contexts it left are segments too
        contexts = [
            *ep.segments,
            *(self._segment(ep, ledger) for ledger, _ in ep.parents),
            self._segment(ep, ep.ledger),
        ]
        kept = [x for x in contexts if x.token_ids] or contexts[-1:]
        model_turns = sum(x.num_model_turns for x in kept if x.token_ids) + ep.other_turns
        # a turn the environment never answered (it failed, the episode was cut) has reward 0
        rewards = (ep.turn_rewards + [0.0] * model_turns)[: max(model_turns, 1)]
        r = ep.request
        return replace(
            kept[-1],
            request_id=r.id,
            finish_reason=ep.finish,
            text=ep.text,
            reward=ep.reward,
            turn_rewards=tuple(rewards),
            env_s=ep.env_s,
            segments=tuple(
                replace(x, reward=ep.reward, request_id=f"{r.id}/segment{i}") for i, x in enumerate(kept[:-1])
            ),
        )
