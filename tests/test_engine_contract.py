"""The `Engine` protocol is the contract: the built-in engine and a second, scripted engine both meet it.

`ScriptedEngine` is a pure-Python engine (no model: token t of a request is a function of its id
and position, log-prob -0.5) with a concurrency cap. The same checks run on it and on `HFEngine`:
what a scheduler may rely on from any engine; `VLLMEngine` runs them too where vLLM is installed.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

import pytest

from schedrl.engine import Engine, EngineConfig, HFEngine
from schedrl.types import Request, Sample, SamplingParams

EOS = 2


class ScriptedEngine:
    """Token i of request r is `3 + crc32(r.id) % 50 + i`; the request ends with eos after `crc32 % 5 + 1`
    tokens (or at its budget)."""

    def __init__(self, max_concurrency: int = 2, version: int = 0) -> None:
        self.version, self.cap = version, max_concurrency
        self.eos_ids = frozenset({EOS})
        self.on_token: Callable | None = None
        self.on_finish: Callable | None = None
        self._waiting: list[Request] = []
        self._running: dict[str, tuple[Request, list[int], list[float], list[int]]] = {}

    def add(self, request: Request) -> None:
        if request.id in self._running or any(r.id == request.id for r in self._waiting):
            raise ValueError(f"request id {request.id!r} is already in the engine")
        self._waiting.append(request)

    def _length(self, r: Request) -> int:
        return zlib.crc32(r.id.encode()) % 5 + 1

    def step(self) -> list[Sample]:
        while self._waiting and len(self._running) < self.cap:
            r = self._waiting.pop(0)
            self._running[r.id] = (r, list(r.prefix_ids), list(r.prefix_logprobs), list(r.prefix_versions))
        done = []
        for rid, (r, toks, lps, vers) in list(self._running.items()):
            n = len(toks)
            tok = EOS if n + 1 == self._length(r) else 3 + zlib.crc32(r.id.encode()) % 50 + n
            toks.append(tok)
            lps.append(-0.5)
            vers.append(self.version)
            if self.on_token is not None:
                self.on_token(rid, tok, -0.5, self.version)
            if tok in self.eos_ids or len(toks) >= r.params.max_new_tokens:
                done.append(self._finish(rid, "stop" if tok in self.eos_ids else "length"))
        return done

    def _finish(self, rid: str, reason: str) -> Sample:
        r, toks, lps, vers = self._running.pop(rid)
        sample = Sample(
            rid,
            r.prompt_ids,
            tuple(toks),
            tuple(lps),
            tuple(vers),
            reason,
            r.params,
            task_id=r.task_id,
            group_id=r.group_id,
            sample_index=r.sample_index,
        )
        if self.on_finish is not None and reason != "aborted":
            self.on_finish(sample)
        return sample

    def abort(self, request_id: str) -> Sample:
        for i, r in enumerate(self._waiting):
            if r.id == request_id:
                del self._waiting[i]
                self._running[r.id] = (
                    r,
                    list(r.prefix_ids),
                    list(r.prefix_logprobs),
                    list(r.prefix_versions),
                )
                return self._finish(r.id, "aborted")
        if request_id not in self._running:
            raise KeyError(f"request {request_id!r} is neither waiting nor running")
        return self._finish(request_id, "aborted")

    def update_weights(self, weights, version: int) -> None:
        self.version = version

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def generate(self, requests: Sequence[Request], on_step=None) -> list[Sample]:
        for r in requests:
            self.add(r)
        done: dict[str, Sample] = {}
        while self.has_unfinished():
            finished = self.step()
            done.update((s.request_id, s) for s in finished)
            if on_step is not None:
                on_step(finished)
        return [done[r.id] for r in requests]

    @property
    def waiting_ids(self) -> list[str]:
        return [r.id for r in self._waiting]

    @property
    def running_ids(self) -> list[str]:
        return list(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)


@pytest.fixture(params=["hf", "scripted", "vllm"])
def engine(request, model, tokenizer):
    if request.param == "hf":
        yield HFEngine(model, tokenizer, EngineConfig(max_concurrency=2))
    elif request.param == "scripted":
        yield ScriptedEngine(max_concurrency=2)
    else:  # skipped without the vllm extra (.ci/run runs it in .venv-vllm)
        pytest.importorskip("vllm")
        from schedrl.engine.vllm_engine import VLLMEngine

        vllm = VLLMEngine(
            model, tokenizer, EngineConfig(max_concurrency=2), vllm_args={"kv_cache_memory_bytes": 64 << 20}
        )
        yield vllm
        vllm.close()


def _requests(n: int, budget: int = 6) -> list[Request]:
    return [Request(f"r{i}", (5, 6, 7 + i), SamplingParams(max_new_tokens=budget, seed=i)) for i in range(n)]


def _check_sample(s: Sample, budget: int) -> None:
    assert len(s.token_ids) == len(s.logprobs) == len(s.versions) <= budget
    assert all(lp <= 0 for lp in s.logprobs)


def test_is_an_engine(engine):
    assert isinstance(engine, Engine)


def test_generate_returns_every_request_in_order_within_budget(engine):
    reqs = _requests(5)
    seen_tokens, finished = [], []
    engine.on_token = lambda rid, tok, lp, v: seen_tokens.append(rid)
    engine.on_finish = finished.append
    out = engine.generate(reqs)
    assert [s.request_id for s in out] == [r.id for r in reqs]
    for s in out:
        _check_sample(s, 6)
        assert s.finish_reason in ("stop", "length")
        assert (s.finish_reason == "stop") == (s.token_ids[-1] in engine.eos_ids)
    assert sorted(seen_tokens) == sorted(s.request_id for s in out for _ in s.token_ids)
    assert {s.request_id for s in finished} == {r.id for r in reqs}
    assert not engine.has_unfinished() and engine.num_waiting == engine.num_running == 0


def test_queue_and_batch_are_visible_between_steps(engine):
    for r in _requests(4):
        engine.add(r)
    assert engine.waiting_ids == ["r0", "r1", "r2", "r3"] and engine.num_running == 0
    engine.step()
    assert engine.num_running + len([i for i in ("r0", "r1") if i not in engine.running_ids]) == 2
    assert set(engine.running_ids) | set(engine.waiting_ids) <= {"r0", "r1", "r2", "r3"}
    assert engine.num_waiting == len(engine.waiting_ids) and engine.num_running == len(engine.running_ids)
    with pytest.raises(ValueError, match="already in the engine"):
        engine.add(_requests(1)[0] if "r0" in engine.running_ids + engine.waiting_ids else _requests(3)[2])


def test_abort_returns_the_prefix_and_resume_continues_within_the_budget(engine):
    budget = 6
    req = Request("long", (5, 6, 7), SamplingParams(max_new_tokens=budget, seed=1, ignore_eos=True))
    engine.add(req)
    engine.step()
    engine.step()
    cut = engine.abort("long")
    assert cut.finish_reason == "aborted" and 1 <= cut.num_tokens < budget
    _check_sample(cut, budget)
    assert not engine.has_unfinished()
    with pytest.raises(KeyError):
        engine.abort("long")
    (resumed,) = engine.generate([Request.resume(cut)])
    assert resumed.token_ids[: cut.num_tokens] == cut.token_ids
    assert resumed.logprobs[: cut.num_tokens] == cut.logprobs
    assert resumed.num_tokens <= budget
    waiting = Request("queued", (5, 6), SamplingParams(max_new_tokens=4))
    engine.add(waiting)
    assert engine.abort("queued").token_ids == ()


def test_weights_between_steps_tag_the_next_tokens(engine, model):
    req = Request("v", (5, 6, 7), SamplingParams(max_new_tokens=6, seed=3, ignore_eos=True))
    engine.add(req)
    engine.step()
    engine.update_weights(model.state_dict(), version=7)
    assert engine.version == 7
    out: list[Sample] = []
    while engine.has_unfinished():
        out += engine.step()
    (s,) = out
    assert s.versions[0] == 0 and set(s.versions[1:]) == {7}
