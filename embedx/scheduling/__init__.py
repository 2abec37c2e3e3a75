"""Scheduling: which device runs which texts, and when, for one model's queue of requests."""

from embedx.scheduling.buckets import Cut, End, Generations, LengthBuckets
from embedx.scheduling.queue import MAX_ITEM_ATTEMPTS, ConvergingQueue
from embedx.scheduling.slots import (
    QUARANTINE_AFTER_FAILURES,
    QUARANTINE_WINDOW,
    REGROW_AFTER,
    Claim,
    DeviceSlot,
    DeviceState,
)
from embedx.scheduling.speed import SpeedModel
from embedx.scheduling.view import DeviceView, QueueView
from embedx.scheduling.work import Item, Job

__all__ = [
    "MAX_ITEM_ATTEMPTS",
    "QUARANTINE_AFTER_FAILURES",
    "QUARANTINE_WINDOW",
    "REGROW_AFTER",
    "Claim",
    "ConvergingQueue",
    "Cut",
    "DeviceSlot",
    "DeviceState",
    "DeviceView",
    "End",
    "Generations",
    "Item",
    "Job",
    "LengthBuckets",
    "QueueView",
    "SpeedModel",
]
