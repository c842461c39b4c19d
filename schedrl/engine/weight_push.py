"""Weight pushes that check themselves, in buckets, through the phases vLLM's weight-transfer API uses.

A `WeightPush` is one policy version on its way from the learner to an engine: its weights in buckets
(a decoder layer each, the rest of the model in one more; or LoRA adapters), each bucket with a
checksum, the list of buckets it must hold, and a probe: a few fixed token sequences with the
learner's log-probs of them under the new weights. The learner gathers it bucket by bucket (a sharded
learner never holds the whole model gathered at once beside its shard: `bucketed`).

An engine takes it in four phases, as vLLM's weight transfer does (`init_weight_transfer_engine`
once, then `start_weight_update`, `update_weights` per chunk, `finish_weight_update`); both engines
implement the last three (`Receiver`), so the built-in engine and vLLM share `receive`:

1. `start_weight_update(version)`;
2. `update_bucket(weights)` per bucket; the engine answers with the checksum of what it now holds
   under those names (the built-in engine reads its weights back) or, where its weights cannot be read
   back (vLLM on a CPU repacks its linear layers), of what its own loader took from the bucket;
3. `finish_weight_update()`: tokens from now on are the new version;
4. the probe: the engine continues the probe's prompts greedily (or scores the learner's continuation,
   where it can run a plain forward) and must produce the learner's tokens with its log-probs within
   `tol`.

A bucket whose checksum differs (stale or corrupted weights), a bucket that never arrived, a push
announced under another version, or a probe off by more than `tol` (weights loaded somewhere the
engine does not generate from, an adapter applied wrongly) is a `WeightPushError` naming the version
and the bucket, in the step it happens: the failure that otherwise shows up weeks later as a run that
trained on its initial policy (verl#7495, trl#5312). Checksums are BLAKE2b over each tensor's float32
bytes in row-major order (the engine's own layout does not change them). The probe catches what a
checksum cannot see, but not a change smaller than `tol`: a stale bucket one small step old can pass
it, which is why buckets carry checksums too.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
PROBE_SEQS, PROBE_PROMPT, PROBE_NEW = 2, 8, 4  # the probe: two prompts of 8 tokens, 4 greedy tokens each


class WeightPushError(RuntimeError):
    """An engine does not hold what a push sent."""


def bucket_of(name: str) -> str:
    """The bucket of weight `name`: its decoder layer (`layers.3`), else `rest` (embeddings, norms, head)."""
    m = LAYER.search(name)
    return f"layers.{m.group(1)}" if m else "rest"


def digest(tensors: Iterable[torch.Tensor]) -> str:
    h = hashlib.blake2b(digest_size=8)
    for t in tensors:
        h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def bucket_digest(weights: Mapping[str, torch.Tensor]) -> str:
    """A bucket's checksum: its tensors in name order."""
    return digest(weights[n] for n in sorted(weights))


def checksums(weights: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """Bucket -> checksum of the bucket's tensors."""
    buckets: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights.items():
        buckets.setdefault(bucket_of(name), {})[name] = tensor
    return {b: bucket_digest(ws) for b, ws in buckets.items()}


def named(
    weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
) -> dict[str, torch.Tensor]:
    """Weights given as a mapping or as (name, tensor) pairs, as a dict."""
    if isinstance(weights, Mapping):
        return {str(k): v for k, v in weights.items()}
    return {name: tensor for name, tensor in weights}


@dataclass
class Bucket:
    name: str  # `layers.3`, `rest`
    weights: dict[str, torch.Tensor]
    sum: str


@dataclass
class Probe:
    """Fixed prompts, the learner's greedy continuation of each under the pushed weights, its log-prob of
    each continuation token and its margin there (top-1 minus top-2 log-prob). An engine that loaded the
    push continues the prompts the same way with log-probs within `tol`; where the learner's margin is
    within `tol` the engine may break the tie otherwise, and the comparison of that sequence ends there."""

    token_ids: list[list[int]]  # prompt + the learner's continuation
    prompt_len: int
    logprobs: list[list[float]]
    margins: list[list[float]]
    tol: float

    @property
    def prompts(self) -> list[list[int]]:
        return [seq[: self.prompt_len] for seq in self.token_ids]


@dataclass
class WeightPush:
    """One policy version for the engines: weights in buckets (or LoRA adapters), and what checks them."""

    version: int
    buckets: list[Bucket] = field(default_factory=list)
    expected: list[str] = field(default_factory=list)  # the buckets the push must hold
    adapters: Any = None  # `training.lora.AdapterWeights` in place of buckets
    probe: Probe | None = None

    @property
    def weights(self) -> dict[str, torch.Tensor]:
        """Every bucket's weights in one dict (a restarted engine starts on them)."""
        return {n: t for b in self.buckets for n, t in b.weights.items()}

    @property
    def numel(self) -> int:
        if self.adapters is not None:
            return self.adapters.numel
        return sum(t.numel() for b in self.buckets for t in b.weights.values())


def bucketed(named: Iterable[tuple[str, Callable[[], torch.Tensor]]], check: bool = True) -> list[Bucket]:
    """Buckets of the weights `named` yields, in its order, each weight fetched by its callable when its
    bucket is reached (a sharded learner gathers one bucket's parameters at a time); with `check`, each
    with its checksum."""
    order: list[str] = []
    names: dict[str, list[tuple[str, Callable[[], torch.Tensor]]]] = {}
    for name, get in named:
        b = bucket_of(name)
        if b not in names:
            order.append(b)
        names.setdefault(b, []).append((name, get))
    out = []
    for b in order:
        weights = {n: get() for n, get in names[b]}
        out.append(Bucket(b, weights, bucket_digest(weights) if check else ""))
    return out


def make_probe(vocab_size: int, model: torch.nn.Module, tol: float) -> Probe:
    """The probe: `PROBE_SEQS` prompts of `PROBE_PROMPT` token ids from a fixed generator, continued
    greedily for `PROBE_NEW` tokens by the causal LM `model` (`greedy`)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (PROBE_SEQS, PROBE_PROMPT), generator=gen)
    tokens, logprobs = greedy(model, ids, PROBE_NEW)
    top = logprobs.topk(2, dim=-1).values
    return Probe(
        torch.cat([ids, tokens], dim=1).tolist(),
        PROBE_PROMPT,
        top[..., 0].tolist(),
        (top[..., 0] - top[..., 1]).tolist(),
        tol,
    )


@torch.no_grad()
def greedy(model: torch.nn.Module, ids: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`model`'s greedy continuation of `ids` for `n` tokens, keys and values cached: the tokens (seqs, n)
    and the log-probs each was chosen from (seqs, n, vocab), in float32 on the CPU. Every rank of a sharded
    model runs it alike (each forward is a collective)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        out = model(input_ids=ids.to(device), use_cache=True)
        tokens, logprobs = [], []
        for step in range(n):
            lp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
            nxt = lp.argmax(-1, keepdim=True)
            tokens.append(nxt)
            logprobs.append(lp)
            if step + 1 < n:
                out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
    finally:
        model.train(was_training)
    return torch.cat(tokens, 1).cpu(), torch.stack(logprobs, 1).cpu()


@torch.no_grad()
def next_token_logprobs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """log p(ids[:, t + 1] | ids[:, :t + 1]) under a causal LM, (seqs, len - 1), in float32."""
    device = next(model.parameters()).device
    logits = model(input_ids=ids.to(device)).logits.float()
    lp = torch.log_softmax(logits[:, :-1], dim=-1)
    return lp.gather(-1, ids[:, 1:].to(device).unsqueeze(-1)).squeeze(-1).cpu()


def push_of(model: torch.nn.Module, version: int, tol: float = 1e-3) -> WeightPush:
    """A push of an unsharded causal LM as the learner makes one: its weights in buckets on the CPU (a
    tied weight once) and the probe from its forward."""
    seen: set[int] = set()
    state = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            state[name] = tensor.detach().to("cpu", copy=True)
    buckets = bucketed((n, lambda t=t: t) for n, t in state.items())
    vocab = int(model.get_input_embeddings().weight.shape[0])  # type: ignore[operator]
    probe = make_probe(vocab, model, tol)
    return WeightPush(version, buckets, [b.name for b in buckets], probe=probe)


class Receiver(Protocol):
    """What an engine implements to take a `WeightPush` (`receive`)."""

    def start_weight_update(self, version: int) -> None: ...

    def update_bucket(self, weights: Mapping[str, torch.Tensor], check: bool = True) -> str:
        """Load `weights`; with `check`, the checksum (`bucket_digest`) of what the engine now holds under
        their names, or of what its loader took where it cannot read its weights back."""
        ...

    def update_adapters(self, adapters: Any) -> None: ...

    def finish_weight_update(self) -> None: ...

    def run_probe(self, probe: Probe) -> list[tuple[list[int], list[float]]]:
        """Each probe prompt's continuation (`len(seq) - prompt_len` tokens: greedy, or the probe's own
        where the engine scores them with a plain forward) and the engine's log-prob of each token."""
        ...


def receive(
    engine: Receiver, push: WeightPush, version: int, name: str = "engine", check: bool = True
) -> None:
    """Load `push` (announced as policy `version`) into `engine` through the four phases; with `check`,
    raise `WeightPushError` where the engine does not hold what was sent (module doc)."""
    if push.version != version:
        raise WeightPushError(
            f"{name}: a weight push announced as version {version} carries version {push.version}'s weights"
        )
    engine.start_weight_update(version)
    if push.adapters is not None:
        engine.update_adapters(push.adapters)
    for bucket in push.buckets:
        held = engine.update_bucket(bucket.weights, check)
        if check and held != bucket.sum:
            raise WeightPushError(
                f"{name}: weight push of version {version}: bucket {bucket.name!r} holds other weights than "
                f"the learner sent (checksum {held} != {bucket.sum})"
            )
    arrived = {b.name for b in push.buckets}
    absent = [b for b in push.expected if b not in arrived]
    if check and absent:
        raise WeightPushError(
            f"{name}: weight push of version {version}: bucket {absent[0]!r} never arrived "
            f"({len(absent)} of {len(push.expected)} missing)"
        )
    engine.finish_weight_update()
    if check and push.probe is not None:
        check_probe(engine.run_probe(push.probe), push.probe, version, name)


def check_probe(
    got: list[tuple[list[int], list[float]]], probe: Probe, version: int, name: str = "engine"
) -> float:
    """The largest |engine - learner| log-prob over the probe; a `WeightPushError` where the engine
    continues a prompt with another token (outside a tie) or differs by more than `probe.tol`."""
    worst, where = 0.0, (0, 0)
    for seq, (tokens, logprobs) in enumerate(got):
        want = probe.token_ids[seq][probe.prompt_len :]
        for t, (tok, lp) in enumerate(zip(tokens, logprobs, strict=False)):
            if tok != want[t]:
                if probe.margins[seq][t] <= probe.tol:  # a tie: either token is the greedy one
                    break
                raise WeightPushError(
                    f"{name}: weight push of version {version}: the engine continues probe {seq} with token "
                    f"{tok} at position {t}, the learner with {want[t]} (its margin {probe.margins[seq][t]:.3g}): "
                    "it does not generate from the weights it was sent"
                )
            diff = abs(lp - probe.logprobs[seq][t])
            if not diff <= worst:
                worst, where = diff, (seq, t)
    if not worst <= probe.tol:
        raise WeightPushError(
            f"{name}: weight push of version {version}: the engine's log-probs of the probe differ from the "
            f"learner's by {worst:.3g} (probe {where[0]}, token {where[1]}; tolerance {probe.tol:g}): it does "
            "not generate from the weights it was sent"
        )
    return worst
