"""Engine backends (`engine.backend`): which engine generates, each declaring what it can do.

    builtin   schedrl's continuous batching over any HF causal LM (`HFEngine`); parks waiting
              trajectories' keys and values in cache slots (`engine.park_slots`)
    vllm      vLLM's V1 engine with schedrl's scheduler inside it (`VLLMEngine`, the `vllm` extra), with
              its own settings in `engine.vllm`; parks by pinning blocks of its KV cache

A backend is a class with `features`, what the policies of a schedule may need of it:

    park        keeps a finished request's keys and values for its continuation (keep_kv_s, continues)
    park_slots  parks in cache slots of its own beside the running batch (engine.park_slots)
    preempt     suspends a running request and resumes it from its prefix (preempt, victims)

It also has `check(settings)` (its `engine.vllm`-style settings, refused with the key's name) and `build(...)`.
A policy that needs a feature the chosen backend lacks is refused when the config loads
(`orchestrate.schedule.check_schedule`), naming the policy, the engine and the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from schedrl.engine.admission import AdmissionPolicy
from schedrl.engine.base import Engine
from schedrl.engine.hf import EngineConfig, HFEngine
from schedrl.engine.vllm_engine import VLLMEngine, check_vllm_args
from schedrl.registry import Registry

ENGINES: Registry[Any] = Registry("engine backend")


@ENGINES.register("builtin")
class Builtin:
    """schedrl's continuous batching over an HF causal LM"""

    features = frozenset({"park", "park_slots", "preempt"})

    @staticmethod
    def check(settings: Mapping[str, Any]) -> None:
        if settings:
            raise ValueError(
                f"'engine.vllm' ({', '.join(sorted(settings))}) is set but engine.backend is 'builtin'; "
                "set engine.backend: vllm"
            )

    @staticmethod
    def build(
        model: Any,
        tokenizer: Any,
        config: EngineConfig,
        admission: AdmissionPolicy,
        version: int,
        settings: Any,
        lora: Mapping[str, Any] | None = None,
        lora_keep: int = 1,
    ) -> Engine:
        """`lora`: adapters arrive as `AdapterWeights`, merged into the weights (`HFEngine.update_adapters`)."""
        return HFEngine(model, tokenizer, config, admission=admission, version=version)


@ENGINES.register("vllm")
class VLLM:
    """vLLM's V1 engine with schedrl's scheduler inside it (the vllm extra)"""

    features = frozenset({"park", "preempt"})

    @staticmethod
    def check(settings: Mapping[str, Any]) -> None:
        """vLLM's settings, against vLLM where it is installed (elsewhere when the engine starts)."""
        with contextlib.suppress(ImportError):  # without vLLM, the engine's start names the extra
            check_vllm_args(settings)

    @staticmethod
    def build(
        model: Any,
        tokenizer: Any,
        config: EngineConfig,
        admission: AdmissionPolicy,
        version: int,
        settings: Any,
        lora: Mapping[str, Any] | None = None,
        lora_keep: int = 1,
    ) -> Engine:
        return VLLMEngine(
            model,
            tokenizer,
            config,
            admission,
            version=version,
            vllm_args=settings,
            lora=lora,
            lora_keep=lora_keep,
        )
