"""The attention policy over a set of entities that classic PPO trains (`policy.kind: attention`).

It lives in `schedrl.entity_attention`, beside its loading and saving, because the engine's learned
admission runs it too; this module keeps the classic names.
"""

from schedrl.entity_attention import EntityAttentionPolicy, load_entity_policy, save_entity_policy

__all__ = ["EntityAttentionPolicy", "load_entity_policy", "save_entity_policy"]
