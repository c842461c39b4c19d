"""Rewards from models: learned reward models scored like any reward function."""

from schedrl.rewards.reward_model import RewardModel

__all__ = ["RewardModel"]
