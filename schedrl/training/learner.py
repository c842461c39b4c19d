"""The learner: applies a registered loss to a batch with micro-batching and an optimizer.

It owns the math's surroundings (forward passes, gradient accumulation, clipping,
learning-rate schedule, the non-finite guard), never the math itself: the loss is a
pure function looked up by name in `schedrl.algos`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import torch
from transformers import PreTrainedModel

from schedrl.algos import entropy_from_logits, masked_mean, offpolicy_stats, token_logprobs
from schedrl.algos.loss_call import loss_call
from schedrl.config import AlgoConfig, OptimConfig
from schedrl.training.batch import TokenBatch, prompt_groups, prompt_lengths
from schedrl.training.lora import apply_lora, load_adapter
from schedrl.training.optimizer import adamw
from schedrl.training.packing import Packing, pack_fewest
from schedrl.training.parallel import (
    Ranks,
    all_sum,
    all_sum_,
    all_true,
    local_norm,
    no_sync,
    sharded_optimizer_state,
    wrap,
)
from schedrl.training.schedules import make_schedule
from schedrl.training.value_head import ValueHead

log = logging.getLogger(__name__)
SHARDED = "sharded"  # a trainer state's optimizer entry {SHARDED: dir}: written by every rank, in `dir`
OPTIMIZER_DIR = "optimizer"


class NonFiniteLossError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite loss or gradient."""


def takes_4d_masks(model: torch.nn.Module) -> bool:
    """Whether the model's attention takes a custom 4D mask as given (HF eager and SDPA), so that rows can
    share prompts: flash attention reads only a 2D padding mask, and sliding-window layers would widen
    to the whole row under a custom mask."""
    config = getattr(model, "config", None)
    layer_types = getattr(config, "layer_types", None) or ()
    sliding = any("sliding" in t for t in layer_types) or (
        not layer_types
        and getattr(config, "sliding_window", None)
        and getattr(config, "use_sliding_window", True)
    )
    return getattr(config, "_attn_implementation", None) in ("eager", "sdpa") and not sliding


def _dtype(model: torch.nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward pass (`optim.gradient_checkpointing`):
    transformers' own switch, non-reentrant, active in training mode only (so generation is unchanged)."""
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if enable is None or not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(
            f"optim.gradient_checkpointing: {type(model).__name__} does not support gradient checkpointing"
        )
    enable(gradient_checkpointing_kwargs={"use_reentrant": False})


class Learner:
    """Trains a policy with one registered loss: forward passes (padding-free, prompts forwarded once),
    micro-batching weighted by the loss's `LossSpec`, PPO epochs and minibatches, AdamW with a
    learning-rate schedule, clipping and a non-finite guard. It computes what the spec asks for
    (reference, proximal and behaviour log-probs, values, vocabulary statistics) and nothing else."""

    def __init__(
        self,
        model: PreTrainedModel,
        optim: OptimConfig,
        algo: AlgoConfig,
        total_steps: int,
        temperature: float = 1.0,
        ref_model: PreTrainedModel | None = None,
        seed: int = 0,
        max_new_tokens: int | None = None,
        ranks: Ranks | None = None,
        lora: dict[str, Any] | None = None,
        adapter: Any = None,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        """`max_new_tokens`: the generation budget, Dr. GRPO's per-row constant (None: the step's longest).
        `ranks`: this process's place in a learner process group (`training.parallel`); the model is
        wrapped or sharded here, and every update trains on this rank's share of the batch. `lora`
        (`training.lora.lora_spec`): the model is wrapped with peft's adapters, and only they train;
        `adapter`, a directory of saved adapters to start from (loaded before the model is sharded).
        `compute_dtype`: what the forward and backward compute in (None: bfloat16 on CUDA, else float32);
        bfloat16 is autocast (FSDP2: its mixed precision), the parameters and AdamW's state unchanged."""
        if lora is not None:
            model = cast(PreTrainedModel, apply_lora(model, lora, seed))
            if adapter is not None:
                load_adapter(model, adapter)
        self.model, self.ref_model = model.train(), ref_model
        self.module, self.ranks = model, ranks  # the model unwrapped
        self.cfg, self.algo = optim, algo
        self.temperature = temperature if temperature > 0 else 1.0
        self.seed = seed
        self.max_new_tokens = max_new_tokens
        self.device = next(model.parameters()).device
        if compute_dtype is None:
            compute_dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.compute_dtype = compute_dtype
        self.padding_free, self._packing_checked = optim.padding_free, False
        self.forward_prompt_once = optim.forward_prompt_once and takes_4d_masks(model)
        self.call = loss_call(algo)  # the loss, its checked algo.loss_args and the run-wide keywords
        if algo.kl_coef > 0 and ref_model is None:
            raise ValueError(f"algo.kl_coef={algo.kl_coef} needs a reference model (ref_model)")
        self.loss_fn, self.spec = self.call.fn, self.call.spec
        self.value_head = None
        if "values" in self.spec.inputs:
            self.value_head = ValueHead(model.config.hidden_size).to(self.device)
        if optim.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        if ranks is not None:
            self.model = wrap(model, ranks, self.device, compute_dtype)
            if self.value_head is not None:  # replicated: every rank starts from rank 0's
                for p in self.value_head.parameters():
                    torch.distributed.broadcast(p.data, 0)
        trainable = [p for p in self.model.parameters() if p.requires_grad]  # LoRA: the adapters only
        params: list = [*trainable, *(self.value_head.parameters() if self.value_head else ())]
        if ranks is not None and ranks.kind == "fsdp2" and self.value_head is not None:
            # sharded and replicated parameters in groups of their own: one fused step takes one kind
            params = [
                {"params": trainable},
                {"params": list(self.value_head.parameters())},
            ]
        self.optimizer = adamw(params, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay)
        schedule = make_schedule(optim.schedule, optim.lr, optim.warmup_steps, total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: schedule(s) / optim.lr)
        self.bad_in_a_row = 0
        self.skipped_steps = 0

    def _autocast(self):
        if self.compute_dtype != torch.float32 and self.device.type in ("cuda", "cpu"):
            return torch.autocast(self.device.type, dtype=self.compute_dtype)
        return contextlib.nullcontext()

    def _forward(self, model: torch.nn.Module, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs (B, L-1) of the targets and the logits (B, L-1, V)."""
        logp, logits, _ = self._forward_values(model, batch, with_values=False)
        return logp, logits

    def _forward_values(
        self, model: torch.nn.Module, batch: TokenBatch, with_values: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """As `_forward`, plus V(s_t) (B, L-1) from the value head at each target's context when asked."""
        packing = self._packing(batch)
        if packing is not None and not self._packing_checked and self.ranks is None:
            self._packing_checked = True
            packing = self._check_packing(model, batch, packing)
        with self._autocast():
            if packing is None:
                out = model(
                    input_ids=batch.input_ids,
                    attention_mask=batch.attention_mask,
                    output_hidden_states=with_values,
                    use_cache=False,
                )
                logits, hidden = out.logits, out.hidden_states[-1] if with_values else None
            else:
                out = model(
                    **packing.model_inputs(_dtype(model)), output_hidden_states=with_values, use_cache=False
                )
                logits = packing.unpack(out.logits)
                hidden = packing.unpack(out.hidden_states[-1]) if with_values else None
            values = None
            if with_values:
                if self.value_head is None or hidden is None:
                    raise ValueError("values were asked of a learner whose loss has no value head")
                values = self.value_head(hidden[:, :-1])
        logits = logits[:, :-1].float()
        return token_logprobs(logits, batch.targets, self.temperature), logits, values

    def _packing(self, batch: TokenBatch) -> Packing | None:
        """The packed layout of `batch` with the fewest tokens: plain, or with prompts shared under
        `forward_prompt_once`; None when padding-free forwards are off or save no token."""
        if not self.padding_free:
            return None
        prefix_lens = prompt_lengths(batch).cpu() if self.forward_prompt_once else None
        packing = pack_fewest(batch.input_ids.cpu(), batch.attention_mask.cpu(), prefix_lens)
        return packing.to(self.device) if packing.saves_tokens else None

    def _check_packing_on(self, batch: TokenBatch) -> None:
        """On a process group, before an update: the packing check on the batch's first rows, the same on
        every rank, so that every rank decides alike and runs the same forwards (a later batch is
        checked if these rows do not pack)."""
        probe = batch.select(torch.arange(min(len(batch), 8))).to(self.device)
        packing = self._packing(probe)
        if packing is not None:
            self._packing_checked = True
            self._check_packing(self.model, probe, packing)

    @torch.no_grad()
    def _check_packing(self, model: torch.nn.Module, batch: TokenBatch, packing: Packing) -> Packing | None:
        """Once per learner: packed log-probs (eval mode, so no dropout) must match the padded forward's.
        A model that ignores position ids, or attends across the packed sequences, would differ: then
        packing is switched off. A shared-prompt layout that differs (a kernel that ignores 4D masks)
        switches prompt sharing off, and plain packing is checked instead. Returns the layout to use."""
        training = model.training
        model.eval()
        try:
            with self._autocast():
                padded = model(
                    input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
                )
                packed = model(**packing.model_inputs(_dtype(model)), use_cache=False)
        finally:
            model.train(training)
        a, b = (
            token_logprobs(x[:, :-1].float(), batch.targets, self.temperature)
            for x in (padded.logits, packing.unpack(packed.logits))
        )
        diff = float(((a - b).abs() * batch.mask).max()) if batch.mask.any() else 0.0
        tol = 1e-3 if self.compute_dtype == torch.float32 else 5e-2  # bfloat16 compute
        if diff <= tol:
            return packing
        if packing.unit_ids is not None:  # the shared layout
            self.forward_prompt_once = False
            log.warning(
                "the shared-prompt forward differs from the padded one by %.3g log-prob on this model: "
                "prompt sharing is off for this run (optim.forward_prompt_once)",
                diff,
            )
            plain = self._packing(batch)
            if plain is None:  # nothing to check on this batch: the next one that packs is checked
                self._packing_checked = False
                return None
            return self._check_packing(model, batch, plain)
        self.padding_free = False
        log.warning(
            "padding-free forward differs from the padded one by %.3g log-prob on this model: "
            "packing is off for this run (optim.padding_free)",
            diff,
        )
        return None

    def _passes(self, batch: TokenBatch) -> list[tuple[torch.Tensor, bool]]:
        """The micro-batches of a forward over every row without gradients, as (rows, real): all of
        them, or this rank's share (and dummies) on a process group."""
        rows = torch.arange(len(batch))
        if self.ranks is None:
            return [(c, True) for c in self._chunks(rows, batch)]
        return self.ranks.plan(rows, lambda r: self._chunks(r, batch))

    def _gathered(self, out: torch.Tensor) -> torch.Tensor:
        """`out` with every rank's rows (each rank computed its own; the rest are zeros there)."""
        return all_sum_(out) if self.ranks is not None else out

    @torch.no_grad()
    def vocab_stats(self, batch: TokenBatch) -> torch.Tensor:
        """The loss's vocabulary statistic (B, L-1) (e.g. the mean of log pi(v | s_t) over the vocabulary)
        under the current policy, without gradients."""
        out = torch.zeros_like(batch.mask)
        for idx, real in self._passes(batch):
            mb = batch.select(idx).to(self.device)
            stat = self._vocab_stat(self._forward(self.model, mb)[1])
            if real:
                out[idx, : mb.targets.shape[1]] = stat.cpu()
        return self._gathered(out)

    @torch.no_grad()
    def values(self, batch: TokenBatch) -> torch.Tensor:
        """V(s_t) (B, L-1) for every target of `batch` under the current value head, without gradients."""
        out = torch.zeros_like(batch.mask)
        for idx, real in self._passes(batch):
            mb = batch.select(idx).to(self.device)
            values = self._forward_values(self.model, mb, True)[2]
            if values is None:
                raise ValueError("values were asked of a learner whose loss has no value head")
            if real:
                out[idx, : mb.targets.shape[1]] = values.float().cpu()
        return self._gathered(out)

    def _vocab_stat(self, logits: torch.Tensor) -> torch.Tensor:
        """The loss's vocabulary statistic of `logits` (B, T, V) -> (B, T)."""
        if self.spec.vocab_stat is None:
            raise ValueError(f"loss {self.call.name!r} declares input 'vocab_stat' without its function")
        return self.spec.vocab_stat(logits, self.temperature)

    @torch.no_grad()
    def logprobs(self, model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
        """Log-probs of every target under `model`, in micro-batches, without gradients."""
        out = torch.zeros_like(batch.mask)
        for idx, real in self._passes(batch):
            mb = batch.select(idx).to(self.device)
            logp = self._forward(model, mb)[0]
            if real:
                out[idx, : mb.targets.shape[1]] = logp.cpu()
        return self._gathered(out)

    def update(
        self, batch: TokenBatch, advantages: torch.Tensor, step: int, version: int | None = None
    ) -> dict[str, float]:
        """One training step: `ppo_epochs` passes of `minibatches` optimizer steps over `batch`.

        `advantages`: (B,) per sequence, or (B, L-1) per target; for a loss that takes `returns` (PPO)
        it is each sequence's reward, turned into token advantages by GAE on the value head here.
        `version`: the policy version of the current weights (pi_prox), default `step`; only the
        cross-stage correction reads it, against `batch.versions`.
        """
        n = len(batch)
        if self.ranks is not None and not self._packing_checked:
            self._check_packing_on(batch)
        several_updates = self.cfg.ppo_epochs * self.cfg.minibatches > 1
        corrected = self.algo.correction != "none"
        # pi_old (pi_prox under a correction): the policy before this step's first update. Recomputed only
        # when it can differ from pi_theta; with one update it is the training forward's own log-probs.
        old_logp = self.logprobs(self.model, batch) if several_updates else None
        ref_logp = (
            self.logprobs(self.ref_model, batch)
            if self.ref_model is not None and self.algo.kl_coef > 0
            else None
        )
        extra: dict[str, torch.Tensor] = {}  # (B, L-1) inputs sliced per micro-batch
        needs = self.spec.inputs
        if corrected and "versions" in needs and batch.versions is None:
            raise ValueError(
                f"algo.correction={self.algo.correction!r} needs per-token policy versions: build the batch "
                "with collate(..., versions=[sample.versions ...])"
            )
        if "returns" in needs:  # token advantages and returns from the value head (GAE)
            extra["old_values"] = self.values(batch)
            if self.spec.token_advantages is None:
                raise ValueError(f"loss {self.call.name!r} declares input 'returns' without token_advantages")
            advantages, extra["returns"] = self.spec.token_advantages(
                advantages, extra["old_values"], batch.mask, **self.call.advantage_kwargs
            )
        if "vocab_stat" in needs and several_updates:
            extra["old_mean_logp"] = self.vocab_stats(batch)
        ctx = {
            "prox_version": step if version is None else version,
            "budget": self.max_new_tokens or int(batch.mask.sum(-1).max()),  # Dr. GRPO's per-row constant
            # losses over whole groups (PACS) see every sample of a group in one micro-batch
            "groups": prompt_groups(batch) if "groups" in needs else None,
            # one update under a correction: pi_prox of every row, filled in by the training forward
            "prox": torch.zeros_like(batch.mask) if corrected and old_logp is None else None,
        }
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        sums: dict[str, float] = defaultdict(float)
        updates = 0
        for _ in range(self.cfg.ppo_epochs):
            for mb_inds in self._minibatch_indices(n, several_updates, gen, ctx["groups"]):
                stats = self._minibatch(batch, advantages, mb_inds, old_logp, ref_logp, extra, ctx)
                for k, v in stats.items():
                    sums[k] += v
                updates += 1
        self.scheduler.step()
        out = {k: v / updates for k, v in sums.items()}
        if corrected:  # pi_prox against pi_behav on the whole batch, before any update
            prox = old_logp if old_logp is not None else self._gathered(ctx["prox"])
            out |= offpolicy_stats(prox, batch.behaviour_logp, batch.mask, self.algo.is_cap)
        out["lr"] = float(self.scheduler.get_last_lr()[0])
        out["skipped_steps"] = float(self.skipped_steps)
        return out

    def _minibatch_indices(self, n: int, shuffle: bool, gen: torch.Generator, groups: torch.Tensor | None):
        """Row indices of each minibatch of one pass; with `groups`, whole groups are shuffled and split."""
        if groups is None:
            perm = torch.randperm(n, generator=gen) if shuffle else torch.arange(n)
            return perm.tensor_split(self.cfg.minibatches)
        n_groups = int(groups.max()) + 1
        order = torch.randperm(n_groups, generator=gen) if shuffle else torch.arange(n_groups)
        return [
            torch.cat([(groups == g).nonzero().squeeze(-1) for g in part.tolist()])
            for part in order.tensor_split(self.cfg.minibatches)
            if len(part)
        ]

    def _chunks(self, rows: torch.Tensor, batch: TokenBatch) -> list[torch.Tensor]:
        """Micro-batches of `rows`: sorted by length, each at most `micro_batch_size` rows and, past
        its first row, `micro_batch_tokens` tokens -- padded tokens (rows of similar length share a
        forward, so little of it is padding), or real tokens when forwards are padding-free. When
        prompts are shared, a group's rows sit side by side (groups by their longest row) and its
        prompt counts once per micro-batch."""
        if not self.cfg.micro_batch_tokens and len(rows) <= self.cfg.micro_batch_size:
            return [rows]  # one forward, whatever the order
        lengths = batch.attention_mask[rows].sum(-1)
        width = dict(zip(rows.tolist(), lengths.tolist(), strict=True))
        if self.padding_free and self.forward_prompt_once:
            group = dict(zip(width, prompt_groups(batch)[rows].tolist(), strict=True))
            prompt = dict(zip(width, prompt_lengths(batch)[rows].tolist(), strict=True))
            longest: dict[int, int] = {}
            for r, n in width.items():
                longest[group[r]] = max(longest.get(group[r], 0), n)
            order = sorted(width, key=lambda r: (-longest[group[r]], group[r], -width[r]))
        else:  # every row a group of its own, sharing nothing
            group, prompt = {r: r for r in width}, {r: 0 for r in width}
            order = rows[torch.argsort(lengths, descending=True, stable=True)].tolist()
        budget = self.cfg.micro_batch_tokens or float("inf")
        chunks: list[list[int]] = []
        tokens, seen = 0, set()  # real tokens in the last chunk, with row r; the groups in it
        for r in order:  # longest first: a chunk's first row sets its padded width
            tokens += width[r] - (prompt[r] if group[r] in seen else 0)
            if chunks:
                cost = tokens if self.padding_free else (len(chunks[-1]) + 1) * width[chunks[-1][0]]
                if len(chunks[-1]) < self.cfg.micro_batch_size and cost <= budget:
                    chunks[-1].append(r)
                    seen.add(group[r])
                    continue
            chunks.append([r])
            tokens, seen = width[r], {group[r]}
        return [torch.tensor(c) for c in chunks]

    def _micro_batches(
        self, mb_inds: torch.Tensor, groups: torch.Tensor | None, batch: TokenBatch
    ) -> list[torch.Tensor]:
        """Split a minibatch into micro-batches; with `groups`, never across a group."""
        if groups is None:
            return self._chunks(mb_inds, batch)
        chunks: list[list[int]] = [[]]
        for g in dict.fromkeys(groups[mb_inds].tolist()):  # groups in order of appearance
            rows = mb_inds[groups[mb_inds] == g].tolist()
            if chunks[-1] and len(chunks[-1]) + len(rows) > self.cfg.micro_batch_size:
                chunks.append([])
            chunks[-1].extend(rows)
        return [torch.tensor(c) for c in chunks]

    def _loss_kwargs(
        self,
        mb: TokenBatch,
        idx: torch.Tensor,
        width: int,
        mb_inds: torch.Tensor,
        ref_logp: torch.Tensor | None,
        extra: dict[str, torch.Tensor],
        ctx: dict[str, Any],
        values: torch.Tensor | None,
        logits: torch.Tensor,
    ) -> dict[str, Any]:
        """The keywords of one micro-batch's loss call: what the loss's spec asks for."""
        kw = dict(self.call.kwargs)
        needs = self.spec.inputs
        if "ref_logp" in needs:
            kw["ref_logp"] = ref_logp[idx, :width].to(self.device) if ref_logp is not None else None
        if "behav_logp" in needs:
            kw["behav_logp"] = mb.behaviour_logp
        if "versions" in needs:
            kw["versions"], kw["prox_version"] = mb.versions, ctx["prox_version"]
        if self.spec.norm == "constant":
            kw["max_tokens"] = len(mb_inds) * ctx["budget"]  # rows x budget, as TRL's dr_grpo
        if "values" in needs:
            kw["values"] = values
        if "vocab_stat" in needs:
            kw["mean_logp"] = self._vocab_stat(logits.detach())
            if "old_mean_logp" not in extra:  # one update: pi_old = pi_theta
                kw["old_mean_logp"] = kw["mean_logp"]
        if "groups" in needs:
            kw["group_index"] = ctx["groups"][idx].to(self.device)
        for k, t in extra.items():
            kw[k] = t[idx, :width].to(self.device)
        return kw

    def _minibatch(
        self,
        batch: TokenBatch,
        advantages: torch.Tensor,
        mb_inds: torch.Tensor,
        old_logp: torch.Tensor | None,
        ref_logp: torch.Tensor | None,
        extra: dict[str, torch.Tensor],
        ctx: dict[str, Any],
    ) -> dict[str, float]:
        """One optimizer step on the rows `mb_inds`: micro-batches accumulate the loss's gradient, weighted
        as its spec's normalisation says, then clipping and the non-finite guard."""
        self.optimizer.zero_grad(set_to_none=True)
        mb_tokens = float(batch.mask[mb_inds].sum().clamp(min=1))
        sums: dict[str, float] = defaultdict(float)
        finite = True
        groups = ctx["groups"]
        if self.ranks is None:
            plan = [(c, True) for c in self._micro_batches(mb_inds, groups, batch)]
        else:
            plan = self.ranks.plan(mb_inds, lambda r: self._micro_batches(r, groups, batch), groups)
        world = self.ranks.world if self.ranks is not None else 1  # DDP and FSDP2 average gradients
        for k, (idx, real) in enumerate(plan):
            with no_sync(self.model, last=k == len(plan) - 1):
                finite &= self._micro_batch(batch, advantages, mb_inds, idx, real, world, old_logp, ref_logp, extra, ctx, mb_tokens, sums)  # fmt: skip
            if not finite and self.ranks is None:
                break
        if self.ranks is not None:
            self._sum_head_grads()
            finite = all_true(finite)
            sums = defaultdict(float, all_sum(sums, sorted(sums)))
        grad_norm = self._clip() if finite else math.nan
        if not (finite and math.isfinite(grad_norm)):
            return self._skip(sums)
        self.optimizer.step()
        self.bad_in_a_row = 0
        sums["grad_norm"] = grad_norm
        return dict(sums)

    def _micro_batch(
        self,
        batch: TokenBatch,
        advantages: torch.Tensor,
        mb_inds: torch.Tensor,
        idx: torch.Tensor,
        real: bool,
        world: int,
        old_logp: torch.Tensor | None,
        ref_logp: torch.Tensor | None,
        extra: dict[str, torch.Tensor],
        ctx: dict[str, Any],
        mb_tokens: float,
        sums: dict[str, float],
    ) -> bool:
        """Forward and backward of the rows `idx` of a minibatch, their loss weighted by their share of it
        (a dummy micro-batch, `real` False, counts zero); adds its statistics to `sums`. False if its
        loss was not finite (then on one process nothing was backpropagated)."""
        summed = self.spec.norm == "constant"  # the loss divides by a constant: micro-batch losses add up
        per_row = self.spec.norm == "sequence"  # a mean over sequences
        weight = 1.0 if real else 0.0
        mb = batch.select(idx).to(self.device)
        logp, logits, values = self._forward_values(self.model, mb, self.value_head is not None)
        width = logp.shape[1]
        old = old_logp[idx, :width].to(self.device) if old_logp is not None else logp.detach()
        if ctx["prox"] is not None and real:
            ctx["prox"][idx, :width] = old.cpu()
        adv = advantages[idx] if advantages.dim() == 1 else advantages[idx, :width]
        kw = self._loss_kwargs(mb, idx, width, mb_inds, ref_logp, extra, ctx, values, logits)
        loss, stats = self.loss_fn(logp, old, adv.to(self.device), mb.mask, **kw)
        bonus_logits = logits if self.algo.entropy_coef else logits.detach()  # grad only when it is a bonus
        entropy = masked_mean(entropy_from_logits(bonus_logits), mb.mask, self.algo.loss_agg)
        # Each micro-batch's mean is weighted by its share of the minibatch.
        share = (
            float(mb.mask.sum()) / mb_tokens
            if self.algo.loss_agg == "token_mean"
            else len(idx) / len(mb_inds)
        )
        if self.algo.entropy_coef:
            loss = loss - self.algo.entropy_coef * (entropy * share if summed else entropy)
        loss_share = (1.0 if summed else len(idx) / len(mb_inds) if per_row else share) * weight
        share *= weight
        finite = bool(torch.isfinite(loss))
        if not finite and self.ranks is None:
            return False
        # on a process group every rank backpropagates, so that the gradient collectives pair up
        (loss * loss_share * world).backward()
        sums["loss"] += loss.item() * loss_share
        sums["entropy"] += entropy.item() * share
        sums["behaviour_vs_learner_abs_logp"] += weight * float(
            ((mb.behaviour_logp - logp.detach()).abs() * mb.mask).sum() / mb_tokens
        )
        for k, v in stats.items():
            sums[k] += v * share
        return finite

    def _sum_head_grads(self) -> None:
        """The value head is replicated, not wrapped: its gradients are averaged over the ranks here."""
        if self.value_head is None or self.ranks is None:
            return
        for p in self.value_head.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            all_sum_(p.grad).div_(self.ranks.world)

    def _clip(self) -> float:
        heads = list(self.value_head.parameters()) if self.value_head is not None else []
        params = [p for p in (*self.model.parameters(), *heads) if p.grad is not None]
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else math.inf
        if self.ranks is None:
            return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        # sharded gradients' norm is gathered from every rank; the head's is the same on all of them
        policy = [p.grad for p in self.model.parameters() if p.grad is not None]
        head = [p.grad for p in heads if p.grad is not None]
        total = float(torch.linalg.vector_norm(torch.stack([local_norm(policy), local_norm(head)]).float()))
        coef = min(1.0, max_norm / (total + 1e-6))
        if coef < 1.0:
            for g in (*policy, *head):
                g.mul_(coef)
        return total

    def _skip(self, sums: dict[str, float]) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        self.bad_in_a_row += 1
        self.skipped_steps += 1
        log.warning("non-finite loss or gradient: optimizer step skipped (%d in a row)", self.bad_in_a_row)
        if self.bad_in_a_row >= self.cfg.max_bad_steps:
            raise NonFiniteLossError(
                f"stopping: {self.bad_in_a_row} optimizer steps in a row had a non-finite loss or gradient "
                f"(optim.max_bad_steps={self.cfg.max_bad_steps})"
            )
        return {k: v for k, v in sums.items() if math.isfinite(v)}

    def state_dict(self) -> dict:
        """What a resume needs besides the policy weights (saved as the HF model), value head included.
        On a process group the optimizer's state is not in it: every rank writes its shard
        (`save_sharded_optimizer`) and the state names the directory."""
        return {
            "value_head": self.value_head.state_dict() if self.value_head is not None else None,
            "optimizer": self.optimizer.state_dict() if self.ranks is None else {SHARDED: OPTIMIZER_DIR},
            "scheduler": self.scheduler.state_dict(),
            "bad_in_a_row": self.bad_in_a_row,
            "skipped_steps": self.skipped_steps,
            "optim_config": asdict(self.cfg),
        }

    def load_state_dict(self, state: dict, directory: Path | None = None) -> None:
        """Restore `state`; a sharded optimizer is read from the checkpoint `directory` it was written to,
        on any number of ranks (torch.distributed.checkpoint reshards it)."""
        if self.value_head is not None:
            self.value_head.load_state_dict(state["value_head"])
        optimizer = state["optimizer"]
        if SHARDED in optimizer:
            if directory is None:
                raise ValueError("a checkpoint with a sharded optimizer is loaded from its directory")
            self.load_sharded_optimizer(directory / optimizer[SHARDED])
            optimizer = None
        elif not optimizer[
            "state"
        ]:  # no step taken yet (checkpoint 0, whose optimizer may hold other params)
            optimizer = None
        elif self.ranks is not None:
            optimizer = sharded_optimizer_state(self.optimizer, optimizer)
        if optimizer is not None:
            self.optimizer.load_state_dict(optimizer)
        self.scheduler.load_state_dict(state["scheduler"])
        self.bad_in_a_row = state["bad_in_a_row"]
        self.skipped_steps = state["skipped_steps"]

    def _modules(self) -> torch.nn.Module:
        """The policy and the value head as one module: what the optimizer steps, named for the
        distributed state-dict API (the same names on one process and on any number of ranks)."""
        modules: dict[str, torch.nn.Module] = {"policy": self.model}
        if self.value_head is not None:
            modules["value_head"] = self.value_head
        return torch.nn.ModuleDict(modules)

    def save_sharded_optimizer(self, path: Path) -> None:
        """Every rank writes its shard of AdamW's state to `path` (torch.distributed.checkpoint; a collective)."""
        from torch.distributed.checkpoint import state_dict_saver
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        state = {"optimizer": get_optimizer_state_dict(self._modules(), self.optimizer)}
        state_dict_saver.save(state, checkpoint_id=str(path))

    def load_sharded_optimizer(self, path: Path) -> None:
        """Read AdamW's state written by `save_sharded_optimizer` on any number of ranks, resharded to this
        learner's layout (one process reads it whole)."""
        from torch.distributed.checkpoint import state_dict_loader
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

        modules = self._modules()
        state = {"optimizer": get_optimizer_state_dict(modules, self.optimizer)}
        with warnings.catch_warnings():  # one process reading: DCP says it assumes so
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            state_dict_loader.load(state, checkpoint_id=str(path))
        set_optimizer_state_dict(modules, self.optimizer, state["optimizer"])
