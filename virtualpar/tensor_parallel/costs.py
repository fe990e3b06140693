"""Closed-form costs of a policy: the collectives it runs and the FLOPs it does, per device.

Every policy's docstring derives these; tests compare them exactly with what a real run moved
(``cluster.stats()``), called (collective events of the trace) and charged (compute events).
Bytes are *sent* per device under the ring algorithms (the shm all_reduce is counted as the ring):

    all_gather of a piece of P bytes over n        (n−1)·P
    reduce_scatter of an array of M bytes over n   (n−1)/n·M
    all_reduce of M bytes over n                   2(n−1)/n·M
    all_to_all of M bytes over n                   (n−1)/n·M
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import UsageError
from ..sim.analytic import ring_time
from ..sim.hardware import get_hardware

__all__ = ["Collective", "PhaseCost", "PolicyCost", "gather_bytes", "scatter_bytes", "reduce_bytes",
           "estimate_hardware", "modelled_estimate"]


def gather_bytes(piece: int, n: int) -> int:
    return (n - 1) * piece


def scatter_bytes(total: int, n: int) -> int:
    return int(Fraction(n - 1, n) * total)


def reduce_bytes(total: int, n: int) -> int:
    return int(Fraction(2 * (n - 1), n) * total)


@dataclass(frozen=True)
class Collective:
    """One collective a device runs: its kind, the mesh axes of its group, bytes it sends."""

    kind: str
    axes: tuple[str, ...]
    bytes_sent: int

    def __str__(self) -> str:
        return f"{self.kind}({','.join(self.axes)})"


@dataclass(frozen=True)
class PhaseCost:
    """Forward or backward: the collectives in order and the FLOPs, per device."""

    collectives: tuple[Collective, ...]
    flops: int

    @property
    def bytes_sent(self) -> int:
        return sum(c.bytes_sent for c in self.collectives)

    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.collectives:
            out[c.kind] = out.get(c.kind, 0) + 1
        return out


@dataclass(frozen=True)
class PolicyCost:
    forward: PhaseCost
    backward: PhaseCost

    def describe(self) -> str:
        fwd = " ".join(map(str, self.forward.collectives)) or "-"
        bwd = " ".join(map(str, self.backward.collectives)) or "-"
        return f"fwd {fwd} | bwd {bwd}"


def estimate_hardware(hardware: Any) -> Any:
    """The :class:`~virtualpar.sim.Hardware` the estimates model: ``hardware`` itself, a preset by
    name, or for ``None`` (a cluster started without ``hardware=``, whose default links are
    NVLink-class between H100-class devices) the ``"h100-node"`` preset's figures."""
    try:
        return get_hardware("h100-node" if hardware is None else hardware)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def modelled_estimate(phase: PhaseCost, mesh: Any, hardware: Any, dtype: Any) -> float:
    """Σ over collectives of ``sim.analytic.ring_time`` (steps·α + bytes sent/β on the intra-node
    link) plus FLOPs / peak: compute-bound kernels, no overlap of communication and compute."""
    hardware = estimate_hardware(hardware)
    a, b = hardware.intra_latency, hardware.intra_bandwidth
    total = phase.flops / hardware.device.peak(dtype)
    for c in phase.collectives:
        n = int(np.prod([mesh.axis_size(x) for x in c.axes]))
        total += ring_time(c.kind, n, c.bytes_sent, a, b)
    return total
