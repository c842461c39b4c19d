"""The learner on N ranks: one process group, each rank training on its share of every batch.

`learner.parallel` picks how the model is held: `ddp` (torch's `DistributedDataParallel`, a full copy
on every rank, gradients all-reduced) or `fsdp2` (`fully_shard` on every decoder layer and the root:
parameters, gradients and optimizer state sharded, gathered layer by layer for each forward and
backward). gloo on CPU, NCCL on CUDA.

Every rank holds the whole batch and cuts the same plan from it (`Ranks.plan`): each minibatch's rows are
split between the ranks (whole prompt groups when the loss needs them), each rank's share into
micro-batches, and every rank runs as many micro-batches as the rank with the most (the others run a
dummy one whose loss counts zero), so the collectives of the forwards and backwards pair up. A
micro-batch's loss is weighted by its share of the *whole* minibatch, as on one process, and scaled by
the number of ranks (DDP and FSDP2 average gradients), so the summed gradient is one process's.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

PARALLEL = ("none", "ddp", "fsdp2")


@dataclass(frozen=True)
class Ranks:
    """This process's place in the learner's process group."""

    rank: int
    world: int
    kind: str  # ddp | fsdp2

    def share(self, rows: torch.Tensor, groups: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Every rank's rows of `rows`, in rank order: contiguous slices, or whole groups (`groups`: the
        group of every row of the batch) dealt in order of appearance."""
        if groups is None:
            return list(rows.tensor_split(self.world))
        order = list(dict.fromkeys(groups[rows].tolist()))
        parts = [order[i :: self.world] for i in range(self.world)]
        return [rows[torch.isin(groups[rows], torch.tensor(p, dtype=groups.dtype))] for p in parts]

    def plan(
        self,
        rows: torch.Tensor,
        split: Callable[[torch.Tensor], list[torch.Tensor]],
        groups: torch.Tensor | None = None,
    ) -> list[tuple[torch.Tensor, bool]]:
        """This rank's micro-batches of `rows` as (rows, real): its share cut by `split`, then dummy
        micro-batches (one row of `rows`, real False) up to the count of the rank with the most."""
        plans = [split(s) if len(s) else [] for s in self.share(rows, groups)]
        most = max(len(p) for p in plans)
        mine = [(c, True) for c in plans[self.rank]]
        return mine + [(rows[:1], False)] * (most - len(mine))


def init_group(rank: int, world: int, port: int, device: torch.device, host: str = "127.0.0.1") -> None:
    """Join the learner's process group at rank 0's `host`:`port` (gloo on CPU, NCCL on CUDA)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        init_method=f"tcp://{host}:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=int(os.environ.get("SCHEDRL_DIST_TIMEOUT_S", "600"))),
    )


def wrap(
    model: torch.nn.Module, ranks: Ranks, device: torch.device, compute_dtype: torch.dtype = torch.float32
) -> torch.nn.Module:
    """`model` held as `ranks.kind` says: DDP's wrapper, or the model itself sharded in place (computing in
    `compute_dtype`: FSDP2's mixed precision gathers the parameters in it and reduces gradients in float32,
    the sharded parameters and the optimizer's state staying as they are)."""
    if ranks.kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, forward_sync_buffers=False)
    if ranks.kind == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (ranks.world,))
        policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        return model
    raise ValueError(f"learner.parallel must be one of {', '.join(PARALLEL)}, got {ranks.kind!r}")


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks FSDP2 shards one by one: an HF causal LM's `model.layers` (or `transformer.h`,
    `gpt_neox.layers`), found under any wrapper (peft's adapters)."""
    for path in ("model.layers", "transformer.h", "gpt_neox.layers"):
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.ModuleList) and (name == path or name.endswith("." + path)):
                return list(module)
    return []


def all_sum_(t: torch.Tensor) -> torch.Tensor:
    """Sum `t` over the ranks, in place (rows a rank did not compute are zeros on it)."""
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_sum(values: dict[str, float], keys: Sequence[str]) -> dict[str, float]:
    """`values` summed over the ranks, for `keys` (a key a rank lacks counts 0 there)."""
    t = torch.tensor([float(values.get(k, 0.0)) for k in keys], dtype=torch.float64)
    all_sum_(t)
    return dict(zip(keys, t.tolist(), strict=True))


def all_true(flag: bool) -> bool:
    t = torch.tensor([1 if flag else 0])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def no_sync(model: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager:
    """DDP: skip the gradient all-reduce on every micro-batch but the last of an optimizer step."""
    sync_off = getattr(model, "no_sync", None)
    return sync_off() if sync_off is not None and not last else contextlib.nullcontext()


def local_norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of `grads` over every rank: a sharded gradient's norm is gathered from its shards."""
    if not grads:
        return torch.zeros(())
    norm = torch.nn.utils.get_total_norm(grads, 2.0)
    full = getattr(norm, "full_tensor", None)
    return full() if full is not None else norm


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on the CPU under their plain names, on rank 0 (an empty dict elsewhere);
    a collective under FSDP2, so every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    inner = getattr(model, "module", model)  # DDP's wrapper holds the model
    if not any(hasattr(p, "full_tensor") for p in inner.parameters()):
        if dist.is_initialized() and dist.get_rank() != 0:
            return {}
        return {k: v.detach().cpu().clone() for k, v in inner.state_dict().items()}
    full = get_model_state_dict(inner, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v for k, v in full.items() if isinstance(v, torch.Tensor)}


def tied_names(model: torch.nn.Module) -> set[str]:
    """Names of parameters that are another, earlier-named parameter (tied embeddings)."""
    seen: set[int] = set()
    tied = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.add(name)
        seen.add(id(p))
    return tied


def sharded_optimizer_state(optimizer: torch.optim.Optimizer, full: dict) -> dict:
    """`full` (one process's optimizer state dict) in `optimizer`'s layout: each tensor sharded as its
    parameter is, the parameters split into `optimizer`'s groups."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = [p for g in optimizer.param_groups for p in g["params"]]
    (saved,) = full["param_groups"]
    if len(saved["params"]) != len(params):
        raise ValueError(
            f"the checkpoint's optimizer holds {len(saved['params'])} parameters, this learner {len(params)}"
        )
    state = {}
    for i, per_param in full["state"].items():
        p = params[int(i)]
        state[i] = {
            k: distribute_tensor(v.to(p.device), p.device_mesh, p.placements)
            if isinstance(p, DTensor) and k != "step"
            else v
            for k, v in per_param.items()
        }
    groups, start = [], 0
    for g in optimizer.param_groups:
        ids = saved["params"][start : start + len(g["params"])]
        groups.append({**{k: v for k, v in saved.items() if k != "params"}, "params": ids})
        start += len(g["params"])
    return {"state": state, "param_groups": groups}
