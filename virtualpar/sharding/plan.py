"""Redistribution: from any sharding spec to any other with the fewest collectives.

Rules, applied in this order (each a step of the plan, run by :meth:`RedistributionPlan.run` on a
device through the device protocol only):

1. A pending reduction ``P(op)`` over the unused axes U: if the target shards a dim d over axes
   that lie in U and the source replicates d — **reduce_scatter** over those axes along d (the
   reduction and the split in one collective); any rest of U — **all_reduce**.
2. A dim whose axes move to another dim (``S(a)`` on i → ``S(a)`` on j, with j replicated in the
   source): **all_to_all** over a, splitting j and concatenating i.
3. A dim sharded in the source and not (or differently) in the target — **all_gather** over the
   source axes.
4. A dim replicated here and sharded in the target — a **local slice**: no communication.

Bytes sent per device (ring algorithms, M the bytes of the local array a step consumes, n the
group size): all_reduce 2(n−1)/n·M, reduce_scatter (n−1)/n·M, all_gather (n−1)·M (it sends its
piece to every peer: (n−1)/n of the gathered result), all_to_all (n−1)/n·M.  The plan's
``format(hardware)`` prints each step with those bytes and the ring's α–β time on the hardware's
links (``sim.analytic``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import ShardingError
from .spec import DimSharding, TensorSharding, bounds
from ..trace.fmt import nbytes, seconds

__all__ = ["Step", "RedistributionPlan", "plan_redistribution"]


@dataclass(frozen=True)
class Step:
    """One step of a plan: ``collective`` (or a local ``slice``) over mesh ``axes``, a group of
    ``group_size``; ``dim`` the dim it gathers, scatters or slices (all_to_all: concatenates),
    ``split_dim`` the dim all_to_all splits, ``op`` the reduction, ``bytes_per_device`` what each
    device sends (the ring's, see the module doc).
    """

    collective: str  # all_reduce | reduce_scatter | all_to_all | all_gather | slice
    axes: tuple[str, ...]
    dim: int | None = None  # all_gather / reduce_scatter / slice: the dim; all_to_all: the concat dim
    split_dim: int | None = None  # all_to_all
    op: str | None = None
    bytes_per_device: float = 0.0
    group_size: int = 1

    def __str__(self) -> str:
        where = f" dim {self.dim}" if self.dim is not None else ""
        if self.collective == "all_to_all":
            where = f" split {self.split_dim} -> concat {self.dim}"
        op = f" {self.op}" if self.op else ""
        return f"{self.collective}({','.join(self.axes)}){op}{where}"


@dataclass(frozen=True)
class RedistributionPlan:
    """How to turn a tensor of ``shape`` (items of ``itemsize`` bytes) sharded as ``src`` into
    ``dst``: ``steps`` in order; ``run(dev, local)`` applies them on a device, ``format(hardware)``
    prints them with bytes and time.
    """

    src: TensorSharding
    dst: TensorSharding
    shape: tuple[int, ...]
    itemsize: int
    steps: tuple[Step, ...]

    @property
    def collectives(self) -> list[str]:
        return [s.collective for s in self.steps if s.collective != "slice"]

    def bytes_per_device(self) -> float:
        return sum(s.bytes_per_device for s in self.steps)

    def run(self, dev: Any, local: np.ndarray) -> np.ndarray:
        """Turn this device's piece under ``src`` into its piece under ``dst``."""
        x = local
        for s in self.steps:
            if s.collective == "all_reduce":
                x = dev.all_reduce(x, op=s.op, group=s.axes, algorithm="ring")
            elif s.collective == "reduce_scatter":
                x = dev.reduce_scatter(x, dim=s.dim, op=s.op, group=s.axes)
            elif s.collective == "all_to_all":
                x = dev.all_to_all(x, split_dim=s.split_dim, concat_dim=s.dim, group=s.axes)
            elif s.collective == "all_gather":
                x = dev.all_gather(x, dim=s.dim, group=s.axes)
            else:  # slice: this device's block of a replicated dim
                n, i = len(dev.group(s.axes)), dev.group_rank(s.axes)
                b = bounds(x.shape[s.dim], n)
                x = np.ascontiguousarray(np.take(x, np.arange(b[i], b[i + 1]), axis=s.dim))
        return x

    def format(self, hardware: Any = None) -> str:
        """The steps, bytes sent per device, and the ring's modelled time on ``hardware``."""
        from ..sim import analytic, get_hardware

        hw = get_hardware(hardware) if hardware is not None else None
        lines = [f"{self.src} -> {self.dst} for shape {self.shape}:"]
        for s in self.steps:
            t = ""
            if hw is not None and s.collective != "slice" and s.group_size > 1:
                modelled = analytic.ring_time(s.collective, s.group_size, s.bytes_per_device,
                                              hw.intra_latency, hw.intra_bandwidth)
                t = f"  modelled {seconds(modelled)}"
            lines.append(f"  {str(s):<40} {nbytes(s.bytes_per_device):>10}/device{t}")
        if not self.steps:
            lines.append("  (nothing to do)")
        return "\n".join(lines)


def plan_redistribution(src: TensorSharding, dst: TensorSharding, shape: Sequence[int], mesh: Any,
                        dtype: Any = np.float64) -> RedistributionPlan:
    """The plan from ``src`` to ``dst`` for a global array of ``shape`` and ``dtype`` on ``mesh``,
    by the rules of the module doc: reduce_scatter / all_reduce, all_to_all, all_gather, then local
    slices.  Raises ``ShardingError`` if either spec does not fit, or if ``dst`` has a pending
    reduction."""
    shape = tuple(int(s) for s in shape)
    src.check(shape, mesh, name="source")
    dst.check(shape, mesh, name="target")
    if dst.partial:
        raise ShardingError(
            f"cannot redistribute to a partial spec ({dst}): a pending reduction is produced by a "
            "computation, not by moving data"
        )
    itemsize = np.dtype(dtype).itemsize
    cur = list(src.dims)
    steps: list[Step] = []

    def local_bytes() -> float:
        return math.prod(_local(shape[d], cur[d], mesh) for d in range(len(shape))) * itemsize

    def size(axes: tuple[str, ...]) -> int:
        return math.prod(mesh.shape[a] for a in axes)

    if src.partial:
        pending = [a for a in src.partial_axes(mesh)]
        for d, want in enumerate(dst.dims):
            axes = tuple(a for a in want.axes if a in pending)
            if axes and not cur[d].axes and axes == want.axes:
                n = size(axes)
                steps.append(Step("reduce_scatter", mesh.axes(axes), d, op=src.partial,
                                  bytes_per_device=(n - 1) / n * local_bytes(), group_size=n))
                cur[d] = DimSharding(mesh.axes(axes))
                pending = [a for a in pending if a not in axes]
        if pending:
            n = size(tuple(pending))
            steps.append(Step("all_reduce", mesh.axes(pending), op=src.partial,
                              bytes_per_device=2 * (n - 1) / n * local_bytes(), group_size=n))
    for i in range(len(shape)):  # axes moving from dim i to a dim j that is replicated now
        for j in range(len(shape)):
            if (
                i != j
                and cur[i].axes
                and cur[i].axes == dst.dims[j].axes
                and not cur[j].axes
                and cur[i] != dst.dims[i]
            ):
                n = size(cur[i].axes)
                steps.append(Step("all_to_all", cur[i].axes, i, split_dim=j,
                                  bytes_per_device=(n - 1) / n * local_bytes(), group_size=n))
                cur[j], cur[i] = cur[i], DimSharding()
    for d in range(len(shape)):
        if cur[d].axes and cur[d] != dst.dims[d]:
            n = size(cur[d].axes)
            steps.append(
                Step("all_gather", cur[d].axes, d, bytes_per_device=(n - 1) * local_bytes(), group_size=n)
            )
            cur[d] = DimSharding()
    for d in range(len(shape)):
        if dst.dims[d].axes and cur[d] != dst.dims[d]:
            steps.append(Step("slice", dst.dims[d].axes, d, group_size=size(dst.dims[d].axes)))
            cur[d] = dst.dims[d]
    return RedistributionPlan(src, dst, shape, itemsize, tuple(steps))


def _local(n: int, dim: DimSharding, mesh: Any) -> int:
    k = math.prod(mesh.shape[a] for a in dim.axes) if dim.axes else 1
    return n // k
