"""Consumption policies of the asynchronous pipeline (`pipeline.consumption`), one file each."""

from schedrl.orchestrate.consumption.base import CONSUMPTION, Consumption
from schedrl.orchestrate.consumption.partial import Partial
from schedrl.orchestrate.consumption.tail import TailBatching
from schedrl.orchestrate.consumption.wave import Wave

__all__ = ["CONSUMPTION", "Consumption", "Partial", "TailBatching", "Wave"]
