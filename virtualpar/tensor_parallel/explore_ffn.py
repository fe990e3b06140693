"""The FeedForward explorer: every assignment of mesh axes to the roles of every FFN policy.

The roles are the policies' own: ``t`` (megatron, sequence_parallel) takes any non-empty ordered
tuple of mesh axes; ``x`` and ``y`` (gspmd) any two disjoint ones.  Each candidate is checked
against the shape (dims must divide) and ranked by the closed-form modelled time of its forward
(``costs.modelled_estimate``).  Its modelled peak memory per device is every array the forward
allocates: the local input blocks, x·W1, +b1, relu, ·W2, +b2, and for each collective its result
plus the bytes it receives (the ring algorithms hold them until they assemble the result); an
upper bound: nothing is freed early.  ``choose_ffn(..., policy="auto")``
returns the fastest candidate whose peak fits the device memory.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ShardingError
from .costs import PolicyCost, estimate_hardware, modelled_estimate
from .ffn import FeedForwardShardingPolicy
from .layout import axes_size
from ..trace.fmt import nbytes

__all__ = ["FFNCandidate", "explore_ffn", "choose_ffn", "ffn_peak_bytes"]


@dataclass(frozen=True)
class FFNCandidate:
    policy: FeedForwardShardingPolicy
    cost: PolicyCost
    peak_bytes: int
    modelled_forward_s: float
    modelled_backward_s: float
    fits: bool


def _ordered_subsets(axes: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Every non-empty set of mesh axes, once, in mesh order: a layout shards over a set of axes in
    mesh order whatever order they are named in (t=(y, x) is the program t=(x, y) — the
    permutations listed each program twice)."""
    return [c for k in range(1, len(axes) + 1) for c in itertools.combinations(axes, k)]


def _policies(mesh: Any) -> list[FeedForwardShardingPolicy]:
    axes = tuple(mesh.axis_names)
    out = [FeedForwardShardingPolicy.named("unsharded", mesh)]
    for t in _ordered_subsets(axes):
        out += [FeedForwardShardingPolicy.named(name, mesh,
                                                t=t) for name in ("megatron", "sequence_parallel")]
    for x in _ordered_subsets(axes):
        for y in _ordered_subsets(tuple(a for a in axes if a not in x)):
            out.append(FeedForwardShardingPolicy.named("gspmd", mesh, x=x, y=y))
    return out


def ffn_peak_bytes(policy: FeedForwardShardingPolicy, b: int, s: int, m: int, h: int, mesh: Any,
                   itemsize: int) -> int:
    """Modelled peak bytes per device of the forward (see the module docstring)."""
    shapes = ((b, s, m), (m, h), (h,), (h, m), (m,))
    lays = policy.layouts()
    local = [math.prod(lay.local_shape(sh, mesh)) for lay, sh in zip(lays, shapes)]
    r = policy.role_axes
    # a collective holds its result plus what it receives: all_gather of n pieces P: nP + (n−1)P;
    # all_reduce of M: M + 2(n−1)/n·M; reduce_scatter of M: M/n + (n−1)/n·M
    if policy.name in ("unsharded", "megatron"):
        t = axes_size(mesh, r.get("t", ()))
        tokens, hid, gathered = b * s, h // t, 0
        coll = (b * s * m) * (3 * t - 2) // t if policy.name == "megatron" else 0
    elif policy.name == "sequence_parallel":
        t = axes_size(mesh, r["t"])
        tokens, hid = b * s, h // t
        gathered, coll = b * s * m * (2 * t - 1) // t, b * s * m
    else:
        p, q = axes_size(mesh, r["x"]), axes_size(mesh, r["y"])
        tokens, hid = b * s // p, h // q
        gathered = tokens * m * (2 * q - 1) // q + 2 * (m * hid * (2 * p - 1) // p)
        coll = tokens * m
    out_local = math.prod(lays[5].local_shape((b, s, m), mesh))
    return itemsize * (sum(local) + gathered + 3 * tokens * hid + tokens * m + coll + out_local)


def explore_ffn(b: int, s: int, m: int, h: int, mesh: Any, hardware: Any,
                dtype: Any = "float32") -> list[FFNCandidate]:
    """Every policy × role assignment that fits the shape, fastest modelled forward first."""
    hardware = estimate_hardware(hardware)
    itemsize = np.dtype(dtype).itemsize
    out = []
    for policy in _policies(mesh):
        try:
            policy.check(b, s, m, h, mesh)
        except ShardingError:
            continue
        cost = policy.cost(b, s, m, h, mesh, itemsize)
        peak = ffn_peak_bytes(policy, b, s, m, h, mesh, itemsize)
        out.append(FFNCandidate(policy, cost, peak, modelled_estimate(cost.forward, mesh, hardware, dtype),
                                modelled_estimate(cost.backward, mesh, hardware, dtype),
                                peak <= hardware.device.memory_capacity))
    return sorted(out,
                  key=lambda c: (c.modelled_forward_s, c.modelled_backward_s, c.peak_bytes, str(c.policy)))


def choose_ffn(b: int, s: int, m: int, h: int, mesh: Any, hardware: Any, dtype: Any = "float32",
               policy: str = "auto") -> FFNCandidate:
    """``policy="auto"``: the fastest candidate on ``hardware`` that fits its memory."""
    if policy != "auto":
        raise ShardingError(f"choose_ffn: unknown policy {policy!r}; expected 'auto'")
    hardware = estimate_hardware(hardware)
    for c in explore_ffn(b, s, m, h, mesh, hardware, dtype):
        if c.fits:
            return c
    raise ShardingError(f"no FeedForward policy for b,s,m,h={(b, s, m, h)} on {mesh} fits "
                        f"{nbytes(hardware.device.memory_capacity)} per device")
