"""Weight pushes that check themselves: each push names its policy version and carries a checksum of each
bucket of weights (a decoder layer; the rest of the model in one more), and the engine that loads it
reads back what it now holds and compares.

A push whose weights did not all arrive, arrived stale, or were loaded somewhere the engine does not
generate from is an error naming the version and the bucket, in the step it happens: the failure that
otherwise shows up weeks later as a run that trained on its initial policy (verl#7495, trl#5312).
The checksum is BLAKE2b over each tensor's float32 bytes in row-major order, so the engine's own layout
(the built-in engine stores its linear weights input-major) does not change it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

import torch

LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class WeightPushError(RuntimeError):
    """An engine does not hold what a push sent."""


def bucket_of(name: str) -> str:
    """The bucket of weight `name`: its decoder layer (`layers.3`), else `rest` (embeddings, norms, head)."""
    m = LAYER.search(name)
    return f"layers.{m.group(1)}" if m else "rest"


def digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.blake2b(digest_size=8)
    for t in tensors:
        h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def checksums(weights: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """Bucket -> checksum of the bucket's tensors, in name order."""
    buckets: dict[str, list[str]] = {}
    for name in sorted(weights):
        buckets.setdefault(bucket_of(name), []).append(name)
    return {b: digest([weights[n] for n in names]) for b, names in buckets.items()}


class PushedWeights(dict):
    """A full state dict (name -> tensor) that carries its policy `version` and each bucket's checksum."""

    version: int
    sums: dict[str, str]

    @classmethod
    def of(cls, weights: Mapping[str, torch.Tensor], version: int) -> PushedWeights:
        out = cls(weights)
        out.version, out.sums = version, checksums(weights)
        return out


def verify(
    held: Mapping[str, torch.Tensor], push: PushedWeights, version: int, engine: str = "engine"
) -> None:
    """Raise `WeightPushError` unless `held` (what `engine` holds after loading `push`, announced as
    `version`) matches the push bucket by bucket."""
    if push.version != version:
        raise WeightPushError(
            f"{engine}: a weight push announced as version {version} carries version {push.version}'s weights"
        )
    names = [n for n in push if n in held]
    missing = sorted(set(push) - set(held))
    if missing:
        raise WeightPushError(
            f"{engine}: weight push of version {version} names unknown weights {missing[:3]}"
        )
    got = checksums({n: held[n] for n in names})
    for bucket, expected in push.sums.items():
        if got.get(bucket) != expected:
            raise WeightPushError(
                f"{engine}: weight push of version {version}: bucket {bucket!r} holds other weights than the "
                f"learner sent (checksum {got.get(bucket)} != {expected})"
            )
