"""LoRA adapters (`learner.lora`), trained with peft, and what reaches the engines: the adapters only.

The learner wraps the policy with peft's `get_peft_model` (only the adapters train; the optimizer and
the checkpoints hold only them). An update sends the engines an `AdapterWeights`: each adapted
linear layer's A, B and scale (alpha / r), a few percent of the model. The engine keeps a copy of the
base weights of those layers and loads W = W_base + scale * B @ A, peft's own merge (`merge_and_unload`;
`merged_state_dict` is it bit for bit, the engine's in-place merge to float rounding), so it generates
from the policy the learner trains.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

LORA_FIELDS = {
    "r": 16,
    "alpha": 32,
    "dropout": 0.0,
    "target_modules": ("q_proj", "k_proj", "v_proj", "o_proj"),
}


def lora_spec(section: Mapping[str, Any]) -> dict[str, Any]:
    """`learner.lora` with its defaults; a `ConfigError`-ready `ValueError` names an unknown key or a bad value."""
    unknown = sorted(set(section) - set(LORA_FIELDS))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(LORA_FIELDS)}")
    spec = {**LORA_FIELDS, **section}
    if not (isinstance(spec["r"], int) and spec["r"] > 0):
        raise ValueError(f"'r' must be a positive integer, got {spec['r']!r}")
    if not 0.0 <= float(spec["dropout"]) < 1.0:
        raise ValueError(f"'dropout' must be in [0, 1), got {spec['dropout']!r}")
    targets = spec["target_modules"]
    spec["target_modules"] = (targets,) if isinstance(targets, str) else tuple(targets)
    return spec


def linear_names(model: torch.nn.Module) -> list[str]:
    """The last names of the model's linear layers: what `target_modules` may name."""
    return sorted(
        {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    )


def check_targets(model: torch.nn.Module, targets: tuple[str, ...]) -> None:
    """Every target names a linear layer of `model`; else a `ValueError` naming it and the candidates."""
    names = linear_names(model)
    missing = [t for t in targets if t not in names]
    if missing:
        raise ValueError(
            f"target module(s) {', '.join(map(repr, missing))} are not linear layers of {type(model).__name__}; "
            f"candidates: {', '.join(names)}"
        )


def apply_lora(model: torch.nn.Module, spec: Mapping[str, Any], seed: int = 0) -> torch.nn.Module:
    """`model` with LoRA adapters on `spec["target_modules"]` (peft; B starts at zero, so the policy is
    unchanged until the first step); only the adapters require gradients. A's random start is drawn
    from `seed`, whatever the process's random state: every rank of a learner process group, and a
    run on any number of ranks, starts from the same adapters."""
    from peft import LoraConfig, get_peft_model

    check_targets(model, spec["target_modules"])
    config = LoraConfig(
        r=spec["r"],
        lora_alpha=spec["alpha"],
        lora_dropout=float(spec["dropout"]),
        target_modules=list(spec["target_modules"]),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, config)


@dataclass
class AdapterWeights:
    """The adapters of one policy version: base weight name -> (A (r, in), B (out, r), scale)."""

    layers: dict[str, tuple[torch.Tensor, torch.Tensor, float]]

    def merged(self, base: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """W_base + scale * B @ A for every adapted weight, from `base` (those weights' base values)."""
        return {name: base[name] + scale * (b @ a) for name, (a, b, scale) in self.layers.items()}

    @property
    def numel(self) -> int:
        return sum(a.numel() + b.numel() for a, b, _ in self.layers.values())


def whole(t: torch.Tensor) -> torch.Tensor:
    """`t` on the CPU, whole: a sharded tensor (FSDP2's DTensor) is gathered from every rank, so every
    rank calls this for the same tensors in the same order."""
    full = getattr(t, "full_tensor", None)
    return (full() if full is not None else t).detach().to("cpu", copy=True)


def adapter_weights(model: torch.nn.Module) -> AdapterWeights:
    """The adapters of a peft-wrapped `model` (or of DDP's or FSDP2's hold of one: a collective then), under
    the names of the base weights they adapt (as the plain model's state dict names them), on the CPU."""
    from peft.tuners.lora import LoraLayer

    inner = getattr(model, "module", model)  # DDP's wrapper holds the model
    layers = {}
    for name, module in inner.named_modules():
        if isinstance(module, LoraLayer) and "default" in module.lora_A:
            lora_a: Any = module.lora_A["default"]
            lora_b: Any = module.lora_B["default"]
            a, b = whole(lora_a.weight), whole(lora_b.weight)
            layers[plain_name(name) + ".weight"] = (a, b, float(module.scaling["default"]))
    return AdapterWeights(layers)


def plain_name(name: str) -> str:
    """A module's name in the model peft wrapped (without `base_model.model.`)."""
    prefix = "base_model.model."
    return name[len(prefix) :] if name.startswith(prefix) else name


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The plain model's state dict of a peft-wrapped `model` (on a process group: gathered, on every rank),
    each adapter merged into its weight."""
    adapters = adapter_weights(model)
    inner = getattr(model, "module", model)
    out = {}
    for key, value in inner.state_dict().items():
        if "lora_" in key:
            continue
        name = plain_name(key).replace(".base_layer.", ".")
        out[name] = whole(value)
    out.update(adapters.merged(out))
    return out


class AdapterBase:
    """An engine's copy of the base weights its adapters add to, taken from the engine's own weights at the
    first adapter it loads (the engine then holds the policy the adapters were trained from), in the
    layout the engine stores them (the built-in engine keeps its linear weights input-major)."""

    def __init__(self) -> None:
        self.base: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def merge_into(self, adapters: AdapterWeights, state: Mapping[str, torch.Tensor]) -> None:
        """Write W_base + scale * B @ A into each adapted weight of `state` (the engine's own tensors)."""
        for name, (a, b, scale) in adapters.layers.items():
            if name not in state:
                raise ValueError(f"adapter for unknown weight {name!r}")
            weight = state[name]
            base = self.base.get(name)
            if base is None:
                base = self.base[name] = weight.detach().clone()  # keeps the engine's strides
            a, b = a.to(weight.device, weight.dtype), b.to(weight.device, weight.dtype)
            if weight.dim() == 2 and not weight.is_contiguous() and weight.t().is_contiguous():
                delta = torch.mm(a.t(), b.t())  # (in, out): the transposed storage, written contiguously
                torch.add(base.t(), delta.mul_(scale), out=weight.t())
            else:
                delta = torch.mm(b, a)
                torch.add(base, delta.mul_(scale), out=weight)


ADAPTER_DIR = "adapter"  # a checkpoint's adapters (peft's adapter_config.json and adapter_model.safetensors)


def load_adapter(model: torch.nn.Module, directory: Any) -> None:
    """Load the adapters saved in `directory` (peft's `save_pretrained`) into the peft-wrapped `model`."""
    from pathlib import Path

    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = load_file(str(Path(directory) / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, weights)
    missing = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    if missing:
        raise ValueError(f"adapters in {str(directory)!r} do not fit this model: {', '.join(missing[:5])}")


def save_adapter(adapters: AdapterWeights, directory: Any, target_modules: tuple[str, ...]) -> None:
    """Write `adapters` as a peft adapter directory (`adapter_config.json`, `adapter_model.safetensors`):
    what `PeftModel.from_pretrained` and vLLM's `LoRARequest` load."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (a0, _, scale) = next(iter(adapters.layers.values()))
    r = a0.shape[0]
    tensors = {}
    for name, (a, b, _) in adapters.layers.items():
        module = "base_model.model." + name.removesuffix(".weight")
        tensors[f"{module}.lora_A.weight"] = a.contiguous()
        tensors[f"{module}.lora_B.weight"] = b.contiguous()
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": r,
        "lora_alpha": scale * r,
        "lora_dropout": 0.0,
        "target_modules": sorted(target_modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))


def zero_adapters(shapes: Mapping[str, tuple[int, int]], r: int, scale: float) -> AdapterWeights:
    """Adapters that change nothing (A and B zero) on weights `shapes` (name -> (out, in))."""
    return AdapterWeights(
        {name: (torch.zeros(r, d_in), torch.zeros(d_out, r), scale) for name, (d_out, d_in) in shapes.items()}
    )
