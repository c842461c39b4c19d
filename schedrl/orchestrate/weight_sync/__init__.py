"""Weight-sync policies of the asynchronous pipeline (`pipeline.weight_sync`), one file each."""

from schedrl.orchestrate.weight_sync.base import WEIGHT_SYNC, WeightSync
from schedrl.orchestrate.weight_sync.cut_resume import CutResume
from schedrl.orchestrate.weight_sync.drain import Drain
from schedrl.orchestrate.weight_sync.inflight import Inflight

__all__ = ["WEIGHT_SYNC", "CutResume", "Drain", "Inflight", "WeightSync"]
