"""Sharding specs, shard/unshard, and redistribution plans (the specs are pure; plans run on devices)."""

from __future__ import annotations

from .plan import RedistributionPlan, Step, plan_redistribution
from .shard import shard, unshard
from .spec import DimSharding, TensorSharding

__all__ = ["DimSharding", "TensorSharding", "shard", "unshard", "plan_redistribution", "RedistributionPlan",
           "Step"]
