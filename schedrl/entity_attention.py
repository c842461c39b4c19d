"""A policy over a set of entities (the jobs of a job shop, the requests waiting for admission):
self-attention in plain torch, one logit per entity, and a value from the mean of the entity embeddings.

It has `ActorCritic`'s interface (`act`, `evaluate`, `value`), so the classic PPO trains it unchanged,
and the engine's learned admission (`schedrl.rollout.learned`) runs what it trained: both read it from
here, so the engine needs nothing of `schedrl.classic`.
The observation is `max_entities x features`; a row whose first feature is 0 is padding (no
attention to it, never an action). The same weights run any number of entities, so a policy trained on
20-job instances evaluates on 100-job ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class EntityAttentionPolicy(nn.Module):
    discrete = True
    log_std = None

    def __init__(self, features: int, dim: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.features = features
        self.embed = nn.Sequential(nn.Linear(features, dim), nn.ReLU(), nn.Linear(dim, dim))
        layer = nn.TransformerEncoderLayer(
            dim, heads, 2 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.pi = nn.Sequential(nn.Linear(2 * dim, dim), nn.ReLU(), nn.Linear(dim, 1))
        self.v = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 1))

    def _encode(self, obs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x = obs.view(obs.shape[0], -1, self.features)  # (B, N, F)
        real = x[..., 0] > 0.5  # (B, N)
        h = self._attend(self.embed(x), real)  # (B, N, D)
        h = h.masked_fill(~real[..., None], 0.0)
        pooled = h.sum(1) / real.sum(1, keepdim=True).clamp(min=1)  # (B, D)
        return h, pooled, real

    def _attend(self, x: Tensor, real: Tensor) -> Tensor:
        """`self.encoder`'s pre-norm layers written out: the same function of the same weights (a test
        checks it against the module), about 1.5x faster than the module's fast path on a CPU, whose
        masked softmax (and `scaled_dot_product_attention`'s flash kernel) cost more than the matmuls at
        these sizes (a few dozen entities, 16 dimensions a head)."""
        batch, n, dim = x.shape
        keys = None if bool(real.all()) else real[:, None, None, :]  # attend to real entities only
        for module in self.encoder.layers:
            layer = cast(nn.TransformerEncoderLayer, module)
            attn = layer.self_attn
            heads = attn.num_heads
            qkv = F.linear(layer.norm1(x), attn.in_proj_weight, attn.in_proj_bias)
            q, k, v = qkv.view(batch, n, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
            scores = (q @ k.transpose(-1, -2)) * (dim // heads) ** -0.5
            if keys is not None:
                scores = scores.masked_fill(~keys, float("-inf"))
            y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, n, dim)
            x = x + attn.out_proj(y)
            x = x + layer.linear2(F.relu(layer.linear1(layer.norm2(x))))
        return x

    def _heads(self, obs: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        h, pooled, real = self._encode(obs)
        # pi's first layer on [h, pooled] without building the concatenation: its weight split in two
        first = cast(nn.Linear, self.pi[0])
        dim = h.shape[-1]
        hidden = (
            F.linear(h, first.weight[:, :dim], first.bias) + F.linear(pooled, first.weight[:, dim:])[:, None]
        )
        logits = self.pi[2](F.relu(hidden)).squeeze(-1)  # (B, N)
        allowed = real if mask is None else (mask & real)
        if not bool(allowed.any(-1).all()):
            raise ValueError("an action mask allows no action for some observation")
        return logits.masked_fill(~allowed, float("-inf")), self.v(pooled).squeeze(-1)

    def value(self, obs: Tensor) -> Tensor:
        return self.v(self._encode(obs)[1]).squeeze(-1)

    @torch.no_grad()
    def act(
        self, obs: Tensor, mask: Tensor | None = None, deterministic: bool = False, temperature: float = 1.0
    ):
        """(actions, their log-probabilities, values); a `temperature` below 1 sharpens the sampling (the
        log-probabilities are then the sharpened distribution's)."""
        logits, value = self._heads(obs, mask)
        logp_all = torch.log_softmax(logits / temperature, -1)
        action = logp_all.argmax(-1) if deterministic else torch.multinomial(logp_all.exp(), 1).squeeze(-1)
        return action, logp_all.gather(-1, action[:, None]).squeeze(-1), value

    def evaluate(self, obs: Tensor, actions: Tensor, mask: Tensor | None = None, with_entropy: bool = True):
        # training only: the engine runs this network to admit requests and imports nothing of algos
        from schedrl.algos.losses import entropy_from_logits

        logits, value = self._heads(obs, mask)
        logp = torch.log_softmax(logits, -1).gather(-1, actions.long()[:, None]).squeeze(-1)
        return logp, entropy_from_logits(logits) if with_entropy else None, value


def load_entity_policy(path: str | Path) -> tuple[EntityAttentionPolicy, dict]:
    """An attention policy and what is known of its training, from a run directory (its latest
    checkpoint and `config.yaml`) or from a file `save_entity_policy` wrote. Errors name the path."""
    path = Path(path)
    if path.is_dir():
        import yaml

        from schedrl.training.checkpoint import latest_checkpoint
        from schedrl.training.run_dir import read_metrics

        ckpt = latest_checkpoint(path / "checkpoints")
        if ckpt is None or not (path / "config.yaml").exists():
            raise ValueError(
                f"{path}: not a classic run directory with a checkpoint (checkpoints/, config.yaml)"
            )
        cfg = yaml.safe_load((path / "config.yaml").read_text())
        p = cfg.get("policy", {})
        if p.get("kind") != "attention":
            raise ValueError(f"{path}: the run's policy.kind is {p.get('kind')!r}, not attention")
        saved = torch.load(ckpt / "model" / "policy.pt", weights_only=False)
        features = saved["state_dict"]["embed.0.weight"].shape[1]
        arch = {"features": int(features), "dim": p["dim"], "layers": p["layers"], "heads": p["heads"]}
        rows = read_metrics(path / "metrics.jsonl") if (path / "metrics.jsonl").exists() else []
        info = {
            "run": str(path),
            "checkpoint": ckpt.name,
            "env_steps": int(max((r.get("env_steps", 0) for r in rows), default=0)),
            "seconds": round(max((r.get("elapsed_s", 0.0) for r in rows), default=0.0), 1),
            "seed": cfg.get("seed"),
            "architecture": arch,
            "env_kwargs": cfg.get("env", {}).get("kwargs", {}),
        }
    elif path.is_file():
        saved = torch.load(path, weights_only=False)
        if not isinstance(saved, dict) or "architecture" not in saved or "state_dict" not in saved:
            raise ValueError(f"{path}: not a policy file (a dict with architecture and state_dict)")
        arch, info = saved["architecture"], saved.get("trained", {})
    else:
        raise ValueError(f"{path}: no such policy file or run directory")
    policy = EntityAttentionPolicy(arch["features"], arch["dim"], arch["layers"], arch["heads"])
    policy.load_state_dict(saved["state_dict"])
    return policy.eval(), {**info, "architecture": arch}


def save_entity_policy(path: str | Path, policy: EntityAttentionPolicy, info: dict) -> None:
    """Write `policy` with its architecture and `info` (how it was trained) as one small file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    enc = cast(nn.TransformerEncoderLayer, policy.encoder.layers[0])
    arch = {
        "features": policy.features,
        "dim": policy.embed[0].out_features,
        "layers": len(policy.encoder.layers),
        "heads": enc.self_attn.num_heads,
    }
    torch.save({"state_dict": policy.state_dict(), "architecture": arch, "trained": info}, path)
