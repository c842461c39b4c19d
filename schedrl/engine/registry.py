"""Engine backends (`engine.backend`): which engine generates, each declaring what it can do.

    builtin   schedrl's continuous batching over any HF causal LM (`HFEngine`); parks waiting
              trajectories' keys and values (`engine.park_slots`)
    vllm      vLLM's V1 engine under schedrl's admission (`VLLMEngine`, the `vllm` extra), with its own
              settings in `engine.vllm`; its prefix cache keeps a finished turn's blocks, it does not park

A backend is a class with `parks` (whether a tool-wait policy may pin a trajectory's cache there),
`check(settings)` (its `engine.vllm`-style settings, refused with the key's name) and `build(...)`.
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

    parks = True

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
    ) -> Engine:
        return HFEngine(model, tokenizer, config, admission=admission, version=version)


@ENGINES.register("vllm")
class VLLM:
    """vLLM's V1 engine under schedrl's admission (the vllm extra)"""

    parks = False

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
    ) -> Engine:
        return VLLMEngine(model, tokenizer, config, admission, version=version, vllm_args=settings)
