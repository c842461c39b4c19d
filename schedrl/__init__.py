"""schedrl: RL post-training where every what-runs-when decision is an explicit scheduler.

import schedrl
schedrl.train("examples/demo.yaml", steps=20)           # a recipe and overrides: a Result
schedrl.Trainer(model, tokenizer, reward_funcs=..., train_dataset=...).train()
schedrl.GRPOTrainer(model, reward_funcs, args=schedrl.GRPOConfig(...), train_dataset=...)  # TRL's names
"""

from typing import TYPE_CHECKING

from schedrl.api import Result, Trainer, train
from schedrl.grpo import GRPOConfig, GRPOTrainer

if TYPE_CHECKING:
    from schedrl.rewards import RewardModel

__version__ = "0.1.0"
__all__ = ["GRPOConfig", "GRPOTrainer", "Result", "RewardModel", "Trainer", "__version__", "train"]


def __getattr__(name: str):
    """`schedrl.RewardModel`, imported when first asked for (it loads torch and transformers)."""
    if name == "RewardModel":
        from schedrl.rewards import RewardModel

        return RewardModel
    raise AttributeError(f"module 'schedrl' has no attribute {name!r}")
