"""The learner on two CPU ranks (gloo): DDP and FSDP2 train as one process does, loss for loss and
parameter for parameter, for GRPO, PPO with a value head and the decoupled off-policy correction."""

from __future__ import annotations

import copy
import os
import pickle
import queue
import socket
import sys

import pytest
import torch
import torch.multiprocessing as mp

from schedrl.config import AlgoConfig, OptimConfig
from schedrl.models import build_char_tokenizer, build_tiny_model
from schedrl.training.batch import collate
from schedrl.training.learner import Learner
from schedrl.training.parallel import Ranks, full_state_dict, init_group

CASES = {
    "grpo": (AlgoConfig(), OptimConfig(micro_batch_size=3, micro_batch_tokens=0)),
    "ppo_value_head": (
        AlgoConfig(loss="ppo", loss_args={"vf_coef": 0.5}, advantage="reward"),
        OptimConfig(micro_batch_size=4, ppo_epochs=2, minibatches=2),
    ),
    "decoupled": (AlgoConfig(correction="decoupled"), OptimConfig(micro_batch_size=5)),
    "lora": (AlgoConfig(), OptimConfig(micro_batch_size=5, lr=1e-3)),  # adapters only (peft)
    "bf16": (AlgoConfig(), OptimConfig(micro_batch_size=5, lr=1e-3)),  # bfloat16 compute
}
LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ("q_proj", "v_proj", "down_proj")}


def _learner(model, case: str, ranks=None) -> Learner:
    algo, optim = CASES[case]
    dtype = torch.bfloat16 if case == "bf16" else torch.float32
    lora = LORA if case == "lora" else None
    return Learner(model, optim, algo, total_steps=10, ranks=ranks, lora=lora, compute_dtype=dtype)


def _batch(seed: int = 0):
    """3 prompts x 4 completions of 1-6 tokens, with behaviour log-probs and versions."""
    g = torch.Generator().manual_seed(seed)
    prompts, completions = [], []
    for _ in range(3):
        prompt = torch.randint(4, 90, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        for _ in range(4):
            n = int(torch.randint(1, 7, (1,), generator=g))
            prompts.append(prompt)
            completions.append(torch.randint(4, 90, (n,), generator=g).tolist())
    behaviour = [[-3.0 - 0.1 * i for i in range(len(c))] for c in completions]
    versions = [[0] * len(c) for c in completions]
    batch = collate(prompts, completions, 0, behaviour, versions)
    return batch, torch.randn(len(prompts), generator=g)


def _train(learner: Learner, steps: int = 2) -> list[dict[str, float]]:
    batch, adv = _batch()
    return [learner.update(batch, adv, step) for step in range(steps)]


def _rank(rank: int, world: int, kind: str, port: int, case: str, weights: dict, out) -> None:
    torch.set_num_threads(1)
    init_group(rank, world, port, torch.device("cpu"))
    try:
        model = build_tiny_model(build_char_tokenizer())
        model.load_state_dict(weights)
        learner = _learner(model, case, Ranks(rank, world, kind))
        stats = _train(learner)
        state = full_state_dict(learner.model)
        head = (
            {k: v.clone() for k, v in learner.value_head.state_dict().items()} if learner.value_head else {}
        )
        if rank == 0:  # as bytes: a tensor through the queue would be shared memory of an exited process
            out.put(pickle.dumps((stats, state, head)))
        torch.distributed.barrier()  # every rank done with the group before any leaves it
    finally:
        torch.distributed.destroy_process_group()
    # done: leave without C++ static destructors (gloo's threads can abort one at exit, SIGABRT), once
    # the queue's feeder thread has written the result
    out.close()
    out.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def on_ranks(kind: str, case: str, weights: dict, world: int = 2):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, kind, port, case, weights, out)) for r in range(world)]
    for p in procs:
        p.start()
    result = None
    while result is None:
        try:
            result = pickle.loads(out.get(timeout=1))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                for p in procs:
                    p.kill()
                raise AssertionError(f"a rank process failed (exit codes {dead})") from None
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0, f"rank process exited with {p.exitcode}"
    return result


@pytest.mark.subprocess
@pytest.mark.train
@pytest.mark.parametrize(
    "kind,case",
    [
        ("ddp", "grpo"),
        ("fsdp2", "grpo"),
        ("fsdp2", "ppo_value_head"),
        ("fsdp2", "decoupled"),
        ("ddp", "ppo_value_head"),
        ("ddp", "lora"),
        ("fsdp2", "lora"),
    ],
)
def test_two_ranks_train_as_one_process(default_model, kind, case):
    torch.manual_seed(0)
    weights = {k: v.clone() for k, v in default_model.state_dict().items()}
    torch.manual_seed(0)  # the value head's initial weights: rank 0's are broadcast, these are one process's
    one = _learner(copy.deepcopy(default_model), case)
    one_stats = _train(one)
    stats, state, head = on_ranks(kind, case, weights)
    assert stats[0].keys() == one_stats[0].keys()
    for a, b in zip(stats, one_stats, strict=True):
        for k in ("loss", "entropy", "grad_norm", *(["vf_loss"] if "vf_loss" in b else [])):
            assert a[k] == pytest.approx(b[k], abs=2e-6, rel=1e-5), k
    moved = 0.0
    for name, p in one.model.state_dict().items():
        start = weights.get(name, torch.zeros_like(p) if "lora_B" in name else None)  # B starts at zero
        step = float((p - start).abs().max()) if start is not None else 0.0
        moved = max(moved, step)
        # float re-association, through AdamW: every weight within 1e-5, except where a gradient that is
        # nearly zero lets Adam's normalisation amplify the last bits (one element in 16k of one matrix,
        # after 8 PPO steps, with transformers 5.25): at most one in a thousand, within a tenth of the move
        off = (state[name] - p).abs()
        assert int((off > 1e-5).sum()) <= max(1, p.numel() // 1000), name
        assert float(off.max()) <= max(1e-5, 0.1 * step), name
    assert moved > 1e-4  # the updates changed the weights: the comparison is not of two copies of the start
    if one.value_head is not None:
        for name, p in one.value_head.state_dict().items():
            torch.testing.assert_close(head[name], p, atol=2e-6, rtol=0)


@pytest.mark.parametrize(
    "learner,pipeline,message",
    [
        (
            {"ranks": 2},
            {"mode": "async"},
            r"'learner.ranks' is 2 with learner.parallel 'none': pick 'ddp' or 'fsdp2'",
        ),
        (
            {"parallel": "ddp", "ranks": 2},
            {},
            r"'learner.parallel' 'ddp' runs the learner as worker processes.*pipeline.mode 'async'",
        ),
        (
            {"parallel": "fsdp2", "ranks": 64},
            {"mode": "async"},
            r"'learner.ranks' is 64, more than the \d+ CPU cores",
        ),
        ({"parallel": "fsdp3"}, {"mode": "async"}, r"learner.parallel.*fsdp3"),
        ({"parallel": "ddp", "ranks": 0}, {"mode": "async"}, r"learner.ranks"),
    ],
)
def test_bad_learner_layouts_are_refused_naming_the_field(learner, pipeline, message):
    from schedrl.api import resolve_config
    from schedrl.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        resolve_config({"learner": learner, "pipeline": pipeline})


@pytest.mark.subprocess
@pytest.mark.train
def test_bfloat16_compute_keeps_float32_parameters_and_optimizer_state(default_model):
    """`learner.compute_dtype: bfloat16`: one process runs its forward and backward under autocast, two FSDP2
    ranks under FSDP2's mixed precision (parameters gathered in bfloat16, gradients reduced in float32);
    either way the parameters and AdamW's moments stay float32. The entropies are bfloat16's (off float32's
    by more than float rounding, within bfloat16's), and the two layouts agree to bfloat16's precision."""
    weights = {k: v.clone() for k, v in default_model.state_dict().items()}
    algo, optim = CASES["bf16"]
    fp32 = Learner(copy.deepcopy(default_model), optim, algo, total_steps=10)  # the same, in float32
    one = _learner(copy.deepcopy(default_model), "bf16")
    ref, got = _train(fp32), _train(one)
    for a, b in zip(got, ref, strict=True):  # (a GRPO loss at ratio 1 is the same in any precision)
        assert 1e-6 < abs(a["entropy"] - b["entropy"]) < 3e-2
    assert all(p.dtype == torch.float32 for p in one.model.parameters())
    assert all(
        v.dtype == torch.float32 for st in one.optimizer.state.values() for v in st.values() if v.dim() > 0
    )
    stats, state, _ = on_ranks("fsdp2", "bf16", weights)
    for a, b in zip(stats, got, strict=True):
        assert a["entropy"] == pytest.approx(b["entropy"], abs=3e-2)
    assert all(t.dtype == torch.float32 for t in state.values())
    for name, p in one.model.state_dict().items():
        torch.testing.assert_close(state[name], p, atol=5e-3, rtol=0)
