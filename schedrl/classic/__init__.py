"""Classic PPO on Gymnasium environments: `Runner` (environments, timing, logging, checkpoints) and
`PPO` (the update), on the pure functions of `schedrl.algos`. `schedrl train examples/cartpole_ppo.yaml`
runs one."""

from schedrl.classic.config import ClassicConfig, classic_config_from_dict, classic_config_to_dict, is_classic
from schedrl.classic.policy import ActorCritic
from schedrl.classic.ppo import PPO
from schedrl.classic.runner import Runner, train_classic

__all__ = [
    "PPO",
    "ActorCritic",
    "ClassicConfig",
    "Runner",
    "classic_config_from_dict",
    "classic_config_to_dict",
    "is_classic",
    "train_classic",
]
