"""Request scheduling inside a rollout: which requests a step sends to the engine, and how.

Ordering (FCFS / longest- / shortest-predicted-first with a starvation guard), length
predictors (sibling, history, learned ranker), divided rollout, online pruning,
speculative prefix reuse and memory-aware admission; the admission policies plug into
the engine by name (`schedule.admission`, see `registry.py`).
"""

from schedrl.rollout.divided import divide, whole_groups
from schedrl.rollout.groups import group_index, group_requests
from schedrl.rollout.memory import PastFutureAdmission, peak_kv_tokens
from schedrl.rollout.ordering import LengthOrdered
from schedrl.rollout.predictors import HistoryPredictor, LengthPredictor, SiblingPredictor
from schedrl.rollout.pruning import PruneConfig, SuccessHead, choose_kept, pruned_rollout, training_samples
from schedrl.rollout.rank_metrics import kendall_tau
from schedrl.rollout.ranker import RankerPredictor
from schedrl.rollout.registry import ADMISSION, PREDICTORS, make_admission, make_predictor
from schedrl.rollout.speculative import DraftStore, SpecStats, verify_drafts

__all__ = [
    "ADMISSION",
    "PREDICTORS",
    "DraftStore",
    "HistoryPredictor",
    "LengthOrdered",
    "LengthPredictor",
    "PastFutureAdmission",
    "PruneConfig",
    "RankerPredictor",
    "SiblingPredictor",
    "SpecStats",
    "SuccessHead",
    "choose_kept",
    "divide",
    "group_index",
    "group_requests",
    "kendall_tau",
    "make_predictor",
    "make_admission",
    "peak_kv_tokens",
    "pruned_rollout",
    "training_samples",
    "verify_drafts",
    "whole_groups",
]
