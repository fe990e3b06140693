"""Device processes and their lifecycle: ``VirtualCluster`` (driver side), ``VirtualDevice`` (device side)."""

from __future__ import annotations

from .cluster import START_METHODS, VirtualCluster
from .device import VirtualDevice
from .requests import Request
from .stats import TrafficStats

__all__ = ["VirtualCluster", "VirtualDevice", "Request", "TrafficStats", "START_METHODS"]
