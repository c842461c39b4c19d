"""LoRA adapters on vLLM: one `LoRARequest` per policy version (`learner.lora`).

An adapter push becomes a peft directory and a new `LoRARequest` (a new id per version: reusing an id
with a new path silently keeps the old weights). A request runs under the adapter of the version it
was admitted under, to its end, so the engine keeps every version a live request uses and at least
the newest `keep` (k + 1, for `schedule.max_staleness` k); older ones are removed from vLLM's cache.

Base requests never run without an adapter: on vLLM 0.32's CPU path a request without LoRA batched
beside LoRA requests has an adapter applied to it (its "no adapter" index reads the last slot). Before
the first push the engine serves version `start` through an adapter whose B is zero, which is exact.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from schedrl.training.lora import AdapterWeights, save_adapter, zero_adapters

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's max_lora_rank choices


def lora_engine_args(spec: Mapping[str, Any], keep: int) -> dict[str, Any]:
    """vLLM settings for adapters of rank `spec["r"]`, `keep` versions at a time and one spare."""
    r = spec["r"]
    rank = next((x for x in LORA_RANKS if x >= r), None)
    if rank is None:
        raise ValueError(f"learner.lora.r = {r} is above vLLM's largest LoRA rank {LORA_RANKS[-1]}")
    return {"enable_lora": True, "max_lora_rank": rank, "max_loras": keep + 1, "max_cpu_loras": keep + 1}


class LoraVersions:
    """The `LoRARequest` of each policy version vLLM holds; `current` is the newest."""

    def __init__(
        self, llm: Any, directory: Path, spec: Mapping[str, Any], shapes: Mapping[str, tuple[int, int]],
        keep: int, start: int,
    ) -> None:  # fmt: skip
        self.llm, self.directory, self.keep = llm, directory, keep
        self.targets = tuple(spec["target_modules"])
        self.held: dict[int, Any] = {}  # version -> its LoRARequest, oldest first
        self.load(zero_adapters(shapes, spec["r"], spec["alpha"] / spec["r"]), start)

    @property
    def current(self) -> Any:
        return self.held[max(self.held)]

    def load(self, adapters: AdapterWeights, version: int) -> None:
        """Add version `version`'s adapters to vLLM (a new `LoRARequest`)."""
        from vllm.lora.request import LoRARequest  # pyright: ignore[reportMissingImports]

        path = self.directory / f"v{version}"
        shutil.rmtree(path, ignore_errors=True)
        save_adapter(adapters, path, self.targets)
        request = LoRARequest(f"v{version}", version + 1, str(path))
        if not self.llm.add_lora(request):
            raise RuntimeError(f"vLLM refused the adapters of version {version} ({path})")
        self.held[version] = request

    def release(self, in_use: set[int]) -> None:
        """Remove versions older than the newest `keep` that no live request uses."""
        newest = sorted(self.held)[-self.keep :]
        for version in [v for v in self.held if v not in newest and v not in in_use]:
            self.llm.remove_lora(self.held.pop(version).lora_int_id)
            shutil.rmtree(self.directory / f"v{version}", ignore_errors=True)


def target_shapes(
    names: Mapping[str, tuple[int, ...]], targets: tuple[str, ...]
) -> dict[str, tuple[int, int]]:
    """The (out, in) shape of each decoder-layer weight an adapter on `targets` adapts."""
    return {
        n: (shape[0], shape[1])
        for n, shape in names.items()
        if ".layers." in n and n.endswith(".weight") and n.rsplit(".", 2)[-2] in targets and len(shape) == 2
    }
