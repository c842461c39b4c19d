"""The recipe of a classic PPO run: an environment section, a PPO section, a policy section.

A recipe is classic when it has a top-level `env:` section (an LM recipe has `task:`); `schedrl train`
and `schedrl.train` read both kinds. The names follow Stable-Baselines3's PPO where one exists
(`n_steps`, `batch_size`, `n_epochs`, `gae_lambda`, `ent_coef`, `vf_coef`, `clip_range_vf`), so an
rl-zoo hyperparameter file translates line by line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from schedrl.config import ConfigError, LoggingConfig, apply_sets, build_dataclass, config_to_dict


@dataclass
class EnvSection:
    id: str = "CartPole-v1"  # a Gymnasium id (registered by gymnasium or by an imported module)
    num_envs: int = 8  # environment copies stepped together (a vector environment)
    # how the copies run: "sync" (one process, in turn), "async" (a process each), or "vector_entry_point"
    # (the environment's own batched implementation, where it has one, e.g. CartPole-v1)
    vectorization: Literal["sync", "async", "vector_entry_point"] = "sync"
    # how a finished copy restarts (gymnasium 1.x autoreset): "same_step" (the step that ends an episode
    # returns the next one's first observation, as SB3's VecEnv), "next_step" (the copy's next step is its
    # reset, a transition that is not trained on); None: same_step, or a batched implementation's own mode
    autoreset: Literal["same_step", "next_step"] | None = None
    kwargs: dict = field(default_factory=dict)  # keyword arguments of gymnasium.make
    max_episode_steps: int | None = None  # None: the registered time limit
    normalize_obs: bool = False  # a running mean and variance (gymnasium's NormalizeObservation), saved
    clip_obs: float = 10.0  # normalized observations are clipped to +- this
    # rewards divided by the running std of the discounted return (SB3's VecNormalize norm_reward), saved
    normalize_reward: bool = False
    clip_reward: float = 10.0  # normalized rewards are clipped to +- this
    module: str | None = None  # a module to import first, which registers `id` (e.g. "my_pkg.envs")


@dataclass
class PPOSection:
    n_steps: int = 128  # steps per environment per rollout
    batch_size: int = 64  # minibatch size
    n_epochs: int = 10  # passes over each rollout
    gamma: float = 0.99  # discount
    gae_lambda: float = 0.95  # GAE's lambda: 1 is the Monte Carlo return, 0 one-step TD
    clip_range: float = 0.2  # PPO's ratio clip epsilon
    clip_range_vf: float | None = None  # None: the value loss is not clipped (SB3's default)
    clip_schedule: Literal["constant", "linear"] = "constant"  # linear: to 0 at the last step
    lr: float = 3e-4  # Adam learning rate
    lr_schedule: Literal["constant", "linear"] = "constant"  # linear: to 0 at the last step
    ent_coef: float = 0.0  # weight of the entropy bonus
    vf_coef: float = 0.5  # weight of the value loss
    max_grad_norm: float = 0.5  # gradients clipped to this global norm
    normalize_advantage: bool = True  # per minibatch, as SB3 and CleanRL do
    target_kl: float | None = None  # stop the epochs of an update once the approximate KL passes this
    max_bad_steps: int = 5  # minibatches in a row whose loss or gradient is not finite before the run stops


@dataclass
class PolicySection:
    # "mlp": two MLPs (actor and critic) on the flattened observation; "attention": self-attention over
    # the rows of a (entities, features) observation, one logit per row (a job shop's jobs)
    kind: Literal["mlp", "attention"] = "mlp"
    hidden: tuple[int, ...] = (64, 64)  # mlp: each of the two networks (actor and critic)
    activation: Literal["tanh", "relu"] = "tanh"  # mlp: the hidden layers' activation
    ortho_init: bool = True  # orthogonal weights: gain sqrt(2) hidden, 0.01 policy head, 1 value head
    log_std_init: float = 0.0  # continuous actions: the initial log standard deviation
    dim: int = 64  # attention: embedding width
    layers: int = 2  # attention: encoder layers
    heads: int = 4  # attention: heads per layer


@dataclass
class PretrainSection:
    # behaviour cloning before PPO: the heuristic to imitate, by the name the environment's
    # teacher_action(name) knows (e.g. "lpt" for schedrl/Admission-v0); None: start from random weights
    teacher: str | None = None
    decisions: int = 20_000  # teacher steps to imitate (over whole episodes)
    epochs: int = 10  # passes over the teacher's decisions
    lr: float = 1e-3  # Adam learning rate of the cloning
    batch_size: int = 256  # decisions per cloning minibatch
    # the entropy bonus of the cloning loss, so the clone still explores: the teacher's action keeps
    # about 1 - (K - 1) exp(-1 / ent_weight) of the mass among K allowed ones (0.15: ~0.9 for K = 64)
    ent_weight: float = 1e-3


@dataclass
class ClassicEval:
    episodes: int = 20  # held-out episodes (seeds disjoint from training), greedy actions
    every: int = 0  # also evaluate every N updates; 0: only before and after training
    deterministic: bool = True  # greedy actions (False: sampled from the policy)
    solved_return: float | None = None  # the 100-episode mean return that counts as solved, if any


@dataclass
class ClassicConfig:
    seed: int = 0  # environments, weights and sampling all derive from it
    total_steps: int = 100_000  # environment steps (over all copies)
    out_dir: str = "runs"  # run directories are made under this
    name: str | None = None  # None: the env id + a timestamp
    save_every: int = 0  # checkpoint every N updates; 0: only at the end
    keep_last: int = 3  # checkpoints kept (older ones deleted)
    threads: int = 1  # torch threads: small networks run fastest on one
    env: EnvSection = field(default_factory=EnvSection)
    ppo: PPOSection = field(default_factory=PPOSection)
    policy: PolicySection = field(default_factory=PolicySection)
    eval: ClassicEval = field(default_factory=ClassicEval)
    pretrain: PretrainSection = field(default_factory=PretrainSection)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    @property
    def steps_per_update(self) -> int:
        return self.ppo.n_steps * self.env.num_envs

    @property
    def updates(self) -> int:
        """PPO updates in the run: total_steps rounded up to whole rollouts."""
        return -(-self.total_steps // self.steps_per_update)


_POSITIVE = (
    "total_steps",
    "keep_last",
    "threads",
    "env.num_envs",
    "env.clip_obs",
    "ppo.n_steps",
    "ppo.batch_size",
    "ppo.n_epochs",
    "ppo.lr",
    "ppo.max_bad_steps",
    "eval.episodes",
    "pretrain.decisions",
    "pretrain.epochs",
    "pretrain.lr",
    "pretrain.batch_size",
)
_NON_NEGATIVE = (
    "save_every",
    "ppo.clip_range",
    "ppo.ent_coef",
    "ppo.vf_coef",
    "ppo.max_grad_norm",
    "eval.every",
    "pretrain.ent_weight",
)
_UNIT = ("ppo.gamma", "ppo.gae_lambda")


def is_classic(data: dict[str, Any]) -> bool:
    """Whether a recipe mapping is a classic one (it has an `env:` section)."""
    return isinstance(data, dict) and "env" in data


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def classic_config_from_dict(data: dict[str, Any] | None, overrides: Sequence[str] = ()) -> ClassicConfig:
    """Build and validate a `ClassicConfig` from a nested dict plus `a.b=c` overrides."""
    cfg = build_dataclass(ClassicConfig, apply_sets(data, overrides))
    for dotted in _POSITIVE:
        if _get(cfg, dotted) <= 0:
            raise ConfigError(f"config field '{dotted}' must be > 0, got {_get(cfg, dotted)!r}")
    for dotted in _NON_NEGATIVE:
        if _get(cfg, dotted) < 0:
            raise ConfigError(f"config field '{dotted}' must be >= 0, got {_get(cfg, dotted)!r}")
    for dotted in _UNIT:
        if not 0 <= _get(cfg, dotted) <= 1:
            raise ConfigError(f"config field '{dotted}' must be in [0, 1], got {_get(cfg, dotted)!r}")
    if any(h <= 0 for h in cfg.policy.hidden):
        raise ConfigError(
            f"config field 'policy.hidden' must hold sizes > 0, got {list(cfg.policy.hidden)!r}"
        )
    if cfg.ppo.batch_size > cfg.steps_per_update:
        raise ConfigError(
            f"config field 'ppo.batch_size' ({cfg.ppo.batch_size}) is larger than a rollout "
            f"(ppo.n_steps x env.num_envs = {cfg.steps_per_update})"
        )
    if cfg.ppo.clip_range_vf is not None and cfg.ppo.clip_range_vf < 0:
        raise ConfigError(
            f"config field 'ppo.clip_range_vf' must be >= 0 or null, got {cfg.ppo.clip_range_vf!r}"
        )
    if cfg.pretrain.teacher is not None and cfg.env.normalize_obs:
        raise ConfigError(
            "config fields 'pretrain.teacher' and 'env.normalize_obs': behaviour cloning sees raw "
            "observations, so it needs env.normalize_obs: false"
        )
    return cfg


def classic_config_to_dict(cfg: ClassicConfig) -> dict[str, Any]:
    """`config.config_to_dict`, named for symmetry with `classic_config_from_dict`."""
    return config_to_dict(cfg)
