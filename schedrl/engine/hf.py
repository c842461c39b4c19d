"""The built-in continuous-batching engine over any HF causal LM (CPU, or CUDA when present).

Each `step()` admits waiting requests (the admission policy picks, the engine
enforces the caps), runs ONE forward over a packed sequence holding every running
request's new tokens (batched prefill for new requests, one token for the rest),
and samples one token per request. Requests leave the batch the step they
finish, and their slot is reused by the next admission.

Parking (the `pin` tool-wait policy): a request with `keep_kv_s > 0` that finishes
keeps its slot, and the keys and values in it, for that many seconds. A request
whose `continues` names it and whose prompt extends its tokens (the history plus a
tool's answer) takes the slot back and prefills only the appended tokens. A parked
slot is given up when its time runs out, when `evict(id)` is called, or when an
admission needs a slot and none is free (the one closest to its expiry goes
first; a slot whose continuation has arrived and waits for a running place never
expires, and goes last); a continuation of an evicted request prefills its whole prompt. Weight
updates keep parked keys and values, as they keep running ones.

Preemption (`preempt(id)`, or a preemptive admission policy's `victims`): a running request leaves
the batch with what it generated, frees its slot, and waits at the front of the queue; readmitted,
it prefills its prompt and prefix again and continues with its own seed and timings, so its output
is that of an uninterrupted run.

Why not `transformers`' own continuous batching (`generate_batch`,
`ContinuousBatchingManager`): it runs its loop in a background thread and owns
its scheduler, and it has no policy-version tag per token, no weight swap with
versioning between steps, no per-request seed, and no resume of a cut request
with its behaviour log-probs. Schedulers here need to steer the engine one step
at a time, so the loop is ours; the model, its attention kernels (SDPA) and its
tokenizer stay HF's.
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from schedrl.engine.admission import FCFS, AdmissionPolicy
from schedrl.engine.attention import ATTN_NAME, LAYOUT_KWARG, StepLayout
from schedrl.engine.base import (
    FinishCallback,
    StepStats,
    TokenCallback,
    check_fits,
    log_event,
    run_to_completion,
)
from schedrl.engine.preemption import Running
from schedrl.engine.sampling import sample_tokens
from schedrl.engine.weight_layout import store_input_major
from schedrl.engine.weight_push import Probe, bucket_digest, named, next_token_logprobs
from schedrl.training.lora import AdapterBase, AdapterWeights
from schedrl.types import FinishReason, Request, Sample, Timings


@dataclass
class EngineConfig:
    """Capacity of the built-in engine."""

    max_concurrency: int = 32  # requests in the running batch
    # cache slots beyond the running batch's, where finished requests park their keys and values
    # for a continuation (the `pin` tool-wait policy); parked requests may also hold free running slots
    park_slots: int = 0
    max_batched_tokens: int = 2048  # tokens in one forward: decode tokens plus prefill tokens
    max_model_len: int | None = None  # tokens per sequence (prompt + output); default: the model's context
    seed: int = 0  # seeds requests that carry no seed of their own
    # Requests admitted in one step with the same prompt (the G samples of a group) prefill it once:
    # the others copy its cached keys/values and sample from its logits with their own seeds
    prefill_prompt_once: bool = True
    # CPU linear weights stored (in, out), so decode-sized products take BLAS's fast path (weight_layout.py)
    input_major_weights: bool = True
    # What attending alone costs a decode row beyond its own keys, in keys (an extra call per layer): rows
    # attend together padded to the longest of them, or alone over exactly their keys, whichever costs
    # fewer keys (`split_decode_rows`). 160 is this CPU's measured overhead; 0 puts every row alone
    row_call_keys: int = 160

    def __post_init__(self) -> None:
        for name in ("max_concurrency", "max_batched_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"EngineConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.row_call_keys < 0:
            raise ValueError(f"EngineConfig.row_call_keys must be >= 0, got {self.row_call_keys}")
        if self.park_slots < 0:
            raise ValueError(f"EngineConfig.park_slots must be >= 0, got {self.park_slots}")
        if self.max_model_len is not None and self.max_model_len <= 1:
            raise ValueError(f"EngineConfig.max_model_len must be > 1, got {self.max_model_len}")


@dataclass
class _Seq:
    """Mutable state of one running request."""

    request: Request
    slot: int
    tokens: list[int]
    logprobs: list[float]
    versions: list[int]
    timings: Timings
    seed: int = 0  # the request's seed, or one the engine drew for it
    n_cached: int = 0  # tokens of prompt + output whose keys/values are in the slot
    ids: list[int] = field(default_factory=list)  # prompt + output
    expires: float = 0.0  # parked: when its slot is given up
    admitted: int = 0  # the engine's admission counter when it entered

    def pending(self) -> list[int]:
        return self.ids[self.n_cached :]


def split_decode_rows(
    rows: Sequence[tuple[int, int, int]], call_keys: int
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """Decode rows (packed index, slot, position) split into those that attend together, padded to the
    longest of them, and those that attend alone over exactly their keys (position + 1 of them).

    Sorted by length, the together group is a shortest prefix of j rows; its cost in keys is j times the
    j-th length, and each row alone costs its own length plus `call_keys` (the overhead of one more call).
    The j of the lowest total wins: one long history among short ones goes alone, a batch of similar
    lengths stays together."""
    order = sorted(rows, key=lambda r: r[2])
    lengths = [r[2] + 1 for r in order]
    alone_cost = sum(lengths) + call_keys * len(lengths)  # j = 0: every row alone
    best_j, best = 0, alone_cost
    for j, length in enumerate(lengths, start=1):
        alone_cost -= length + call_keys
        cost = j * length + alone_cost
        if cost <= best:
            best_j, best = j, cost
    return order[:best_j], order[best_j:]


def _additive(allowed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Boolean keep-mask -> additive mask (0 keep, -inf drop), built once per step for every layer."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, float("-inf")
    )


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    gen_eos = getattr(model.generation_config, "eos_token_id", None)
    ids = [tokenizer.eos_token_id, *(gen_eos if isinstance(gen_eos, list) else [gen_eos])]
    return frozenset(i for i in ids if isinstance(i, int))


class HFEngine:
    """Continuous batching, per-token log-probs and versions, abort/resume, in-flight weight swaps."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        config: EngineConfig | None = None,
        admission: AdmissionPolicy | None = None,
        on_token: TokenCallback | None = None,
        on_finish: FinishCallback | None = None,
        version: int = 0,
        clock: Callable[[], float] = time.perf_counter,
        share: HFEngine | None = None,
    ) -> None:
        """`share`: run on that engine's model, not a copy of `model` (see `beside`)."""
        self.config = config or EngineConfig()
        self.clock = clock  # stamps timings and parking deadlines (a virtual clock in simulations)
        self.tokenizer = tokenizer
        self._adapter_base = AdapterBase()  # the base weights LoRA adapters add to, once one arrives
        if share is not None:
            self.model = share.model
        else:  # the engine owns a copy: its attention is swapped for the packed kernel
            self.model = copy.deepcopy(model).eval()
            self.model.set_attn_implementation(ATTN_NAME)
            if self.config.input_major_weights:
                store_input_major(self.model)
        self.device = next(self.model.parameters()).device
        self.admission = admission if admission is not None else FCFS()
        self.on_token, self.on_finish = on_token, on_finish
        bind = getattr(self.admission, "bind", None)
        if bind is not None:  # a policy that follows the running batch chains onto the callbacks
            bind(self)
        self.version = self._next_version = version
        self.eos_ids = _eos_ids(self.model, tokenizer)
        mc = self.model.config
        context = getattr(mc, "max_position_embeddings", None) or 2048
        self.max_model_len = min(self.config.max_model_len or context, context)
        self._alloc_cache(mc)
        self._generator = torch.Generator().manual_seed(self.config.seed)
        self._waiting: list[Request] = []
        self._arrival: dict[str, float] = {}
        self._running: dict[str, _Seq] = {}
        self._parked: dict[str, _Seq] = {}  # finished requests that keep their slot for a continuation
        # a min-heap: lowest slot first
        self._free_slots = list(range(self.config.max_concurrency + self.config.park_slots))
        self.num_steps = 0
        self.num_generated = 0
        self.num_shared_prefill = 0  # prompt tokens not recomputed: copied from a twin admitted with them
        self.num_prefill_tokens = 0  # tokens computed in multi-token rows (prompts, resumes, extensions)
        self.num_reused = 0  # tokens not recomputed because a continuation took its parked slot back
        self.num_evicted = 0  # parked slots given up because an admission needed them
        self.num_expired = 0  # parked slots given up at the end of their time to live
        self.num_preempted = 0  # running requests suspended for a waiting one
        self.num_preempted_tokens = 0  # keys and values a suspension dropped (recomputed at readmission)
        self.preemptions: list[tuple[int, str]] = []  # (step, request id) of each suspension (the newest)
        self.admissions: list[str] = []  # request ids in the order they entered the batch (the newest)
        self._admissions = 0
        self._suspended: dict[str, tuple[int, Timings]] = {}  # preempted id -> its seed and timings
        self.last_step = StepStats()

    def _alloc_cache(self, mc) -> None:
        heads = mc.num_attention_heads
        kv_heads = getattr(mc, "num_key_value_heads", None) or heads
        head_dim = getattr(mc, "head_dim", None) or mc.hidden_size // heads
        dtype = next(self.model.parameters()).dtype
        slots = self.config.max_concurrency + self.config.park_slots
        shape = (slots, kv_heads, self.max_model_len, head_dim)
        with torch.inference_mode():
            self._cache = [
                (
                    torch.zeros(shape, dtype=dtype, device=self.device),
                    torch.zeros(shape, dtype=dtype, device=self.device),
                )
                for _ in range(mc.num_hidden_layers)
            ]

    # ---- requests in and out -------------------------------------------------------------
    def add(self, request: Request) -> None:
        if request.id in self._arrival:
            raise ValueError(f"request id {request.id!r} is already in the engine")
        parked = self._parked.get(request.continues) if request.continues is not None else None
        if parked is not None and parked.expires <= self.clock():  # too late: it prefills everything
            self.evict(parked.request.id)
            self.num_expired += 1
            parked = None
        if parked is not None:
            held = parked.ids
            if request.prefix_ids or tuple(request.prompt_ids[: len(held)]) != tuple(held):
                raise ValueError(
                    f"request {request.id!r} continues {request.continues!r} but its prompt does not "
                    f"start with that request's {len(held)} tokens"
                )
            parked.expires = float("inf")  # it came back in time: only pressure evicts it now, last
        check_fits(request, self.max_model_len, self.config.max_batched_tokens)
        self._waiting.append(request)
        self._arrival[request.id] = self.clock()

    def abort(self, request_id: str) -> Sample:
        for i, req in enumerate(self._waiting):
            if req.id == request_id:
                del self._waiting[i]
                _, timings = self._suspended.pop(request_id, (0, Timings(arrival=self._arrival[request_id])))
                return self._sample(
                    req,
                    list(req.prefix_ids),
                    list(req.prefix_logprobs),
                    list(req.prefix_versions),
                    "aborted",
                    timings,
                )
        seq = self._running.get(request_id)
        if seq is None:
            raise KeyError(f"request {request_id!r} is neither waiting nor running")
        return self._finish(seq, "aborted")

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def preempt(self, request_id: str) -> None:
        """Suspend a running request: it leaves the batch with what it generated and waits at the front
        of the queue, to resume from that prefix when admitted again."""
        seq = self._running.pop(request_id, None)
        if seq is None:
            raise KeyError(f"request {request_id!r} is not running (only a running request is preempted)")
        heapq.heappush(self._free_slots, seq.slot)
        self.num_preempted += 1
        self.num_preempted_tokens += seq.n_cached
        log_event(self.preemptions, (self.num_steps, request_id))
        self._suspended[request_id] = (seq.seed, seq.timings)
        resumed = dataclasses.replace(
            seq.request,
            prefix_ids=tuple(seq.tokens),
            prefix_logprobs=tuple(seq.logprobs),
            prefix_versions=tuple(seq.versions),
            continues=None,
        )
        self._waiting.insert(0, resumed)

    def _preempt_for_waiting(self) -> None:
        victims = getattr(self.admission, "victims", None)
        if victims is None or not self._waiting or not self._running:
            return
        free = min(
            self.config.max_concurrency - len(self._running), len(self._free_slots) + len(self._parked)
        )
        for rid in victims(self.running_requests(), list(self._waiting), max(free, 0)):
            self.preempt(rid)

    def running_requests(self) -> list[Running]:
        """The running batch as a preemption or migration rule sees it."""
        return [Running(s.request, len(s.tokens), s.admitted) for s in self._running.values()]

    def evict(self, request_id: str) -> bool:
        """Give up a parked request's slot; False if it was not parked (never, or already evicted)."""
        seq = self._parked.pop(request_id, None)
        if seq is None:
            return False
        heapq.heappush(self._free_slots, seq.slot)
        return True

    @property
    def num_cached_tokens(self) -> int:
        """Tokens whose keys and values the engine holds: running and parked requests (memory in use)."""
        return sum(len(s.ids) for s in (*self._running.values(), *self._parked.values()))

    @property
    def parked_ids(self) -> list[str]:
        """Finished requests whose keys and values are kept for a continuation."""
        return list(self._parked)

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

    def beside(self, config: EngineConfig) -> HFEngine:
        """A second engine on this engine's model, with a queue and KV cache of its own: the same weights,
        as each push updates them in place (the policy judging its own samples, `judge: policy`)."""
        return HFEngine(self.model, self.tokenizer, config, share=self)

    def update_weights(
        self,
        weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]] | AdapterWeights,
        version: int,
    ) -> None:
        """Copy new weights in place; cached keys/values of running requests are kept. `weights` may be
        LoRA adapters (`training.lora.AdapterWeights`): they are merged into a kept copy of the base."""
        self.start_weight_update(version)
        if isinstance(weights, AdapterWeights):
            self.update_adapters(weights)
        else:
            self.update_bucket(named(weights))
        self.finish_weight_update()

    # ---- weight pushes in phases (`distributed.weight_push.Receiver`) -----------------------
    def start_weight_update(self, version: int) -> None:
        self._next_version = version

    @torch.no_grad()
    def update_bucket(self, weights: Mapping[str, torch.Tensor], check: bool = True) -> str:
        """Copy `weights` in; with `check`, the checksum of what the model now holds under their names (read
        back)."""
        state = self.model.state_dict()
        for name, tensor in weights.items():
            if name not in state:
                raise ValueError(f"update_weights: unknown parameter {name!r} for this model")
            state[name].copy_(tensor)
        return bucket_digest({n: state[n] for n in weights}) if check else ""

    def update_adapters(self, adapters: AdapterWeights) -> None:
        self._adapter_base.merge_into(adapters, self.model.state_dict())

    def finish_weight_update(self) -> None:
        self.version = self._next_version

    def run_probe(self, probe: Probe) -> list[tuple[list[int], list[float]]]:
        """The model's log-prob of each of the probe's continuation tokens (a plain forward)."""
        lp = next_token_logprobs(self.model, torch.tensor(probe.token_ids))[:, probe.prompt_len - 1 :]
        return [(seq[probe.prompt_len :], row) for seq, row in zip(probe.token_ids, lp.tolist(), strict=True)]

    # ---- one step --------------------------------------------------------------------------
    def _admit(self) -> None:
        now = self.clock()
        for rid in [r for r, seq in self._parked.items() if seq.expires <= now]:
            self.evict(rid)
            self.num_expired += 1
        if not self._waiting:
            return
        self._preempt_for_waiting()
        budget = self.config.max_batched_tokens - len(self._running)
        # A continuation whose slot is parked goes first: the slot is already its own.
        taken = set()
        room = self.config.max_concurrency - len(self._running)  # places left in the running batch
        for i, req in enumerate(self._waiting):
            held = self._parked.get(req.continues) if req.continues is not None else None
            if held is not None and room > 0 and len(req.prompt_ids) - held.n_cached <= budget:
                room -= 1
                budget -= len(req.prompt_ids) - held.n_cached
                taken.add(i)
                self._start(req, now, held)
        fresh = [i for i in range(len(self._waiting)) if i not in taken]
        if fresh and room > 0 and (self._free_slots or self._parked):
            waiting = [self._waiting[i] for i in fresh]
            chosen = self.admission.select(
                waiting,
                free_slots=min(room, len(self._free_slots) + len(self._parked)),
                token_budget=budget,
                num_running=len(self._running),
            )
            for j in chosen:
                req = waiting[j]
                cost = req.num_prefill_tokens
                if fresh[j] in taken or room <= 0 or (cost > budget and self._running):
                    break
                room -= 1
                if not self._free_slots:  # an admission needs a slot: the parked one expiring first goes
                    if not self._parked:
                        break
                    self.evict(min(self._parked, key=lambda r: self._parked[r].expires))
                    self.num_evicted += 1
                budget -= cost
                taken.add(fresh[j])
                self._start(req, now)
        if taken == set(range(len(taken))):  # the usual case: a prefix of the queue
            del self._waiting[: len(taken)]
        else:
            self._waiting = [r for i, r in enumerate(self._waiting) if i not in taken]

    def _start(self, req: Request, now: float, held: _Seq | None = None) -> None:
        seed, timings = self._suspended.pop(
            req.id, (None, Timings(arrival=self._arrival[req.id], admitted=now))
        )
        if held is not None:  # the parked slot's keys and values cover the continuation's prompt head
            del self._parked[held.request.id]
            seq = _Seq(req, held.slot, [], [], [], timings, n_cached=held.n_cached)
            self.num_reused += held.n_cached
        else:
            slot = heapq.heappop(self._free_slots)
            seq = _Seq(
                req, slot, list(req.prefix_ids), list(req.prefix_logprobs), list(req.prefix_versions), timings
            )
        seq.ids = list(req.prompt_ids) + seq.tokens
        if seed is None:
            seed = req.params.seed if req.params.seed is not None else self._draw_seed()
        seq.seed, seq.admitted = seed, self._admissions
        self._admissions += 1
        log_event(self.admissions, req.id)
        self._running[req.id] = seq

    def _draw_seed(self) -> int:
        return int(torch.randint(0, 2**62, (1,), generator=self._generator))

    def _layout(self, seqs: Sequence[_Seq]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, StepLayout]:
        ids, pos, slots, last = [], [], [], []
        decode: list[tuple[int, int, int]] = []  # (packed index, slot, position) of single-token rows
        pre_rows, ext_rows = [], []
        first: dict[tuple[int, ...], int] = {}  # the tokens of a fresh multi-token row -> its index in seqs
        copies: list[tuple[int, int, int]] = []  # (slot, slot it copies, tokens): twins of an earlier row
        for r, seq in enumerate(seqs):
            new = seq.pending()
            if self.config.prefill_prompt_once and len(new) > 1 and seq.n_cached == 0:
                twin = first.setdefault(tuple(new), r)
                if twin != r:  # same tokens from position 0: same keys/values, same logits
                    last.append(last[twin])
                    copies.append((seq.slot, seqs[twin].slot, len(new)))
                    continue
            start = len(ids)
            ids.extend(new)
            pos.extend(range(seq.n_cached, seq.n_cached + len(new)))
            slots.extend([seq.slot] * len(new))
            last.append(len(ids) - 1)
            if len(new) == 1:
                decode.append((start, seq.slot, seq.n_cached))
            elif seq.n_cached:  # a continuation of a parked request: its appended tokens
                ext_rows.append((start, len(new), seq.slot, seq.n_cached))
            else:  # a newly admitted request: its prompt (and any resumed prefix)
                pre_rows.append((start, len(new)))
        batched, alone = split_decode_rows(decode, self.config.row_call_keys)
        dec_tok = [tok for tok, _, _ in batched]
        dec_slot = [slot for _, slot, _ in batched]
        dec_pos = [position for _, _, position in batched]
        dev = self.device
        layout = StepLayout(self._cache, torch.tensor(slots, device=dev), torch.tensor(pos, device=dev))
        layout.long_rows = [(tok, slot, position + 1) for tok, slot, position in alone]
        mask_dtype = self._cache[0][0].dtype
        if dec_tok:
            # Slots are handed out lowest first, so the busy ones sit at the front of the cache.
            n_slots = max(dec_slot) + 1
            length = max(dec_pos) + 1
            keys = torch.arange(length, device=dev)
            layout.dec_tok = torch.tensor(dec_tok, device=dev)
            layout.dec_slot = torch.tensor(dec_slot, device=dev)
            layout.dec_full = 2 * len(dec_tok) >= n_slots
            if layout.dec_full:
                row_pos = torch.zeros(n_slots, dtype=torch.long, device=dev)
                row_pos[layout.dec_slot] = torch.tensor(dec_pos, device=dev)
            else:
                row_pos = torch.tensor(dec_pos, device=dev)
            layout.dec_mask = _additive(keys[None, :] <= row_pos[:, None], mask_dtype)[:, None, None, :]
        if pre_rows:  # whole prompts (plus any resumed prefix), each starting at position 0
            lq = max(n for _, n in pre_rows)
            tok, src, dst = [], [], []
            for r, (start, n) in enumerate(pre_rows):
                tok += [*range(start, start + n), *[start] * (lq - n)]  # padded with a real index
                src += range(r * lq, r * lq + n)
                dst += range(start, start + n)
            layout.pre_tok = torch.tensor(tok, device=dev).view(len(pre_rows), lq)
            layout.pre_src, layout.pre_dst = torch.tensor(src, device=dev), torch.tensor(dst, device=dev)
            offs = torch.arange(lq, device=dev)
            layout.pre_mask = _additive(offs[None, :] <= offs[:, None], mask_dtype)[
                None, None
            ]  # (1, 1, Lq, Lq)
        if ext_rows:
            lq = max(n for _, n, _, _ in ext_rows)
            tok, src, dst, qpos = [], [], [], []
            for r, (start, n, _, cached) in enumerate(ext_rows):
                tok += [*range(start, start + n), *[start] * (lq - n)]
                src += range(r * lq, r * lq + n)
                dst += range(start, start + n)
                qpos.append([*range(cached, cached + n), *[cached] * (lq - n)])
            layout.ext_tok = torch.tensor(tok, device=dev).view(len(ext_rows), lq)
            layout.ext_slot = torch.tensor([s for _, _, s, _ in ext_rows], device=dev)
            layout.ext_src, layout.ext_dst = torch.tensor(src, device=dev), torch.tensor(dst, device=dev)
            keys = torch.arange(max(c + n for _, n, _, c in ext_rows), device=dev)
            allowed = keys[None, None, :] <= torch.tensor(qpos, device=dev)[:, :, None]  # (Be, Lq, Lk)
            layout.ext_mask = _additive(allowed, mask_dtype)[:, None]
        prefill = sum(n for _, n in pre_rows) + sum(n for _, n, _, _ in ext_rows)
        self.num_prefill_tokens += prefill
        self.last_step = StepStats(len(decode), prefill, sum(s.n_cached + len(s.pending()) for s in seqs))
        if copies:
            layout.copy_dst = torch.tensor([d for d, _, _ in copies], device=dev)
            layout.copy_src = torch.tensor([s for _, s, _ in copies], device=dev)
            layout.copy_len = max(n for _, _, n in copies)
            self.num_shared_prefill += sum(n for _, _, n in copies)
        as_t = lambda x: torch.tensor(x, device=dev)[None]  # noqa: E731
        return as_t(ids), as_t(pos), torch.tensor(last, device=dev), layout

    def step(self) -> list[Sample]:
        self._admit()
        if not self._running:
            return []
        self.num_steps += 1
        seqs = list(self._running.values())
        ids, pos, last, layout = self._layout(seqs)
        with torch.inference_mode():
            out = self.model(
                input_ids=ids,
                position_ids=pos,
                use_cache=False,
                logits_to_keep=last,
                **{LAYOUT_KWARG: layout},
            )
            if layout.copy_dst is not None:
                # Twins take their row's cache; positions past their own length are masked until overwritten.
                n = layout.copy_len
                for kc, vc in self._cache:
                    kc[layout.copy_dst, :, :n] = kc[layout.copy_src, :, :n]
                    vc[layout.copy_dst, :, :n] = vc[layout.copy_src, :, :n]
        logits = out.logits[0]  # (R, V)
        tokens, logprobs = sample_tokens(
            logits, [s.request.params for s in seqs], [s.seed for s in seqs], [len(s.tokens) for s in seqs]
        )
        now = self.clock()
        finished = []
        for seq, tok, lp in zip(seqs, tokens.tolist(), logprobs.tolist(), strict=True):
            seq.n_cached = len(seq.ids)
            seq.ids.append(tok)
            seq.tokens.append(tok)
            seq.logprobs.append(lp)
            seq.versions.append(self.version)
            if seq.timings.first_token is None:
                seq.timings.first_token = now
            self.num_generated += 1
            if self.on_token is not None:
                self.on_token(seq.request.id, tok, lp, self.version)
            reason = self._stop_reason(seq, tok)
            if reason is not None:
                finished.append(self._finish(seq, reason))
        return finished

    def _stop_reason(self, seq: _Seq, tok: int) -> FinishReason | None:
        params = seq.request.params
        if (tok in self.eos_ids and not params.ignore_eos) or tok in params.stop_token_ids:
            return "stop"
        if params.stop_strings:
            # Every token decodes to >= 1 character, except specials (0): the margin covers a few.
            width = max(len(s) for s in params.stop_strings) + 8
            tail = self.tokenizer.decode(seq.tokens[-width:], skip_special_tokens=True)
            if any(s in tail for s in params.stop_strings):
                return "stop"
        if len(seq.tokens) >= params.max_new_tokens or len(seq.ids) >= self.max_model_len:
            return "length"
        return None

    def _finish(self, seq: _Seq, reason: FinishReason) -> Sample:
        del self._running[seq.request.id]
        seq.timings.finished = self.clock()
        if seq.request.keep_kv_s > 0 and reason != "aborted":
            seq.expires = seq.timings.finished + seq.request.keep_kv_s
            self._parked[seq.request.id] = seq
        else:
            heapq.heappush(self._free_slots, seq.slot)
        return self._sample(seq.request, seq.tokens, seq.logprobs, seq.versions, reason, seq.timings)

    def _sample(self, req, tokens, logprobs, versions, reason, timings) -> Sample:
        self._arrival.pop(req.id, None)
        sample = Sample(
            request_id=req.id,
            prompt_ids=req.prompt_ids,
            token_ids=tuple(tokens),
            logprobs=tuple(logprobs),
            versions=tuple(versions),
            finish_reason=reason,
            params=req.params,
            text=str(self.tokenizer.decode(tokens, skip_special_tokens=True)),
            timings=timings,
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
