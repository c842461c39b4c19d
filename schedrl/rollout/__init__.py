"""Request scheduling inside a rollout: which requests a step sends to the engine, and how."""

from schedrl.rollout.groups import group_index, group_requests

__all__ = ["group_index", "group_requests"]
