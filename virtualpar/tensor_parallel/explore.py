"""The policy explorer: every assignment of mesh axes to the dims of A (m, k) and B (k, n).

Each mesh axis independently shards one dim of A or none, and one dim of B or none (9 choices per
axis; 81 on a 2-axis mesh).  For each assignment the program is *derived* by the redistribution
rules — shard → replicate by all_gather, partial → replicate by all_reduce — as a list of steps:

1. k: if A's k and B's k are sharded over the same axes, the local product is a partial sum over
   them (kept, reduced in step 4); otherwise each operand's k is all_gathered over its axes.
2. n: if an axis shards both A's m and B's n, B's n is all_gathered (over all its axes).
3. f: an operand replicated over an axis along which the other operand's local block varies
   passes through f (its gradient's contributions are summed in the backward).  A gather along
   such an axis is the varying ``all_gather`` (backward reduce_scatter), else the invariant one
   (backward: a slice).  Gathers over several axes go minor axis first, so each gives contiguous blocks.
4. C_l = A_l·B_l, then all_reduce over the partial axes (``g``).  C's layout: [S(A's m), S(B's n kept)].

The same steps give the program (run on a cluster and checked against numpy), its collectives,
bytes and FLOPs per device (forward and backward), and its modelled peak memory (every array the
forward allocates, nothing freed early: the input blocks, C_l, and for each collective its result
plus the bytes it receives, which the ring algorithms hold until they assemble the result).  Candidates are
ranked by the closed-form modelled time on the hardware (``costs.modelled_estimate``).
``choose(..., policy="auto")`` returns the fastest candidate whose peak fits the device memory.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ShardingError
from ..kernels import matmul_backward_flops, matmul_flops
from . import autodiff as ad
from .costs import (Collective, PhaseCost, PolicyCost, estimate_hardware, gather_bytes, modelled_estimate,
                    reduce_bytes, scatter_bytes)
from ..sharding import TensorSharding
from .layout import format_layout

Layout = tuple[tuple[str, ...], ...]  # per dim, the mesh axes that shard it (a TensorSharding's .axes)
from ..trace.fmt import nbytes

__all__ = ["Step", "DerivedMatMul", "derive", "assignments", "Candidate", "explore", "choose"]


@dataclass(frozen=True)
class Step:
    """``op`` in {"f", "all_gather", "all_gather_invariant", "matmul", "g"} on ``tensor`` ("A", "B", "C")."""

    op: str
    tensor: str
    axis: str
    dim: int = -1


@dataclass(frozen=True)
class DerivedMatMul:
    """A MatMul layer whose program is the derived ``steps`` (usable with runner and execute)."""

    a: Layout  # per-dim mesh axes of A, B and C (the specs are input_layouts() and output_layout())
    b: Layout
    c: Layout
    steps: tuple[Step, ...]

    def input_layouts(self) -> tuple[TensorSharding, TensorSharding]:
        return TensorSharding.from_axes(self.a), TensorSharding.from_axes(self.b)

    def output_layout(self) -> TensorSharding:
        return TensorSharding.from_axes(self.c)

    @property
    def name(self) -> str:
        return f"A{format_layout(self.a)}·B{format_layout(self.b)}"

    def forward(self, dev: Any, a: Any, b: Any) -> Any:
        vals = {"A": a, "B": b}
        for s in self.steps:
            if s.op == "g":
                vals["C"] = ad.g(vals["C"], dev, (s.axis,))
                continue
            if s.op == "matmul":
                vals["C"] = ad.matmul(vals["A"], vals["B"], dev)
                continue
            x = vals[s.tensor]
            vals[s.tensor] = ad.f(x, dev, (s.axis,)) if s.op == "f" else \
                getattr(ad, s.op)(x, dev, s.dim, (s.axis,))
        return vals["C"]

    def cost(self, m: int, k: int, n: int, mesh: Any, itemsize: int) -> tuple[PolicyCost, int]:
        """(forward and backward collectives and FLOPs, modelled peak bytes) from the steps."""
        shape = {"A": [m // _size(mesh, self.a[0]), k // _size(mesh, self.a[1])],
                 "B": [k // _size(mesh, self.b[0]), n // _size(mesh, self.b[1])]}
        peak = (math.prod(shape["A"]) + math.prod(shape["B"])) * itemsize
        fwd: list[Collective] = []
        bwd: list[Collective] = []
        flops = back = 0
        for s in self.steps:
            size = mesh.axis_size(s.axis) if s.axis else 1
            if s.op == "matmul":
                (mm, kk), (_, nn) = shape["A"], shape["B"]
                shape["C"] = [mm, nn]
                flops = matmul_flops(mm, kk, nn)
                back = sum(matmul_backward_flops(mm, kk, nn))
                peak += mm * nn * itemsize
            elif s.op == "g":
                nbytes = math.prod(shape["C"]) * itemsize
                fwd.append(Collective("all_reduce", (s.axis,), reduce_bytes(nbytes, size)))
                peak += nbytes + reduce_bytes(nbytes, size)  # result + the chunks it receives
            elif s.op == "f":
                bwd.append(
                    Collective(
                        "all_reduce", (s.axis,), reduce_bytes(math.prod(shape[s.tensor]) * itemsize, size)
                    )
                )
            else:
                piece = math.prod(shape[s.tensor]) * itemsize
                fwd.append(Collective("all_gather", (s.axis,), gather_bytes(piece, size)))
                shape[s.tensor][s.dim] *= size
                peak += piece * size + piece * (size - 1)  # result + the pieces it receives
                if s.op == "all_gather":
                    bwd.append(Collective("reduce_scatter", (s.axis,), scatter_bytes(piece * size, size)))
        return PolicyCost(PhaseCost(tuple(fwd), flops), PhaseCost(tuple(reversed(bwd)), back)), peak


def _size(mesh: Any, axes: tuple[str, ...]) -> int:
    return math.prod(mesh.axis_size(a) for a in axes)


def derive(a: Layout, b: Layout, replicate_output: bool = False) -> DerivedMatMul:
    """The program for A in layout ``a`` and B in layout ``b`` (rules 1-4 of the module docstring);
    ``replicate_output``: then all_gather C (invariant) over its sharded axes, so C is [R, R]."""
    (am, ak), (bk, bn) = a, b
    partial = ak if ak and ak == bk else ()
    gather_a = {1: ak} if ak and not partial else {}
    gather_b = {0: bk} if bk and not partial else {}
    bn_keep = bn
    if set(bn) & set(am):
        gather_b[1], bn_keep = bn, ()
    a_after = set(am) | set(partial)          # axes along which A's local block varies after its gathers
    b_after = set(bn_keep) | set(partial)
    steps: list[Step] = []
    for name, gathers, other, own in (
        ("A", gather_a, b_after, set(am) | set(ak)),
        ("B", gather_b, a_after, set(bk) | set(bn)),
    ):
        for axis in sorted(other - own):
            steps.append(Step("f", name, axis))
        for dim, axes in sorted(gathers.items()):
            for axis in reversed(axes):  # minor axis first: contiguous blocks at every stage
                steps.append(Step("all_gather" if axis in other else "all_gather_invariant", name, axis, dim))
    steps.append(Step("matmul", "C", ""))
    steps += [Step("g", "C", axis) for axis in partial]
    if replicate_output:
        for dim, axes in ((0, am), (1, bn_keep)):
            steps += [Step("all_gather_invariant", "C", axis, dim) for axis in reversed(axes)]
        return DerivedMatMul(a, b, ((), ()), tuple(steps))
    return DerivedMatMul(a, b, (am, bn_keep), tuple(steps))


def assignments(mesh: Any) -> list[tuple[Layout, Layout]]:
    """Every (A layout, B layout): each axis shards A's m, A's k or nothing, and B's k, B's n or nothing."""
    out = []
    for choice in itertools.product(itertools.product((None, 0, 1), repeat=2), repeat=mesh.ndim):
        a: list[tuple[str, ...]] = [(), ()]
        b: list[tuple[str, ...]] = [(), ()]
        for axis, (da, db) in zip(mesh.axis_names, choice):
            if da is not None:
                a[da] += (axis,)
            if db is not None:
                b[db] += (axis,)
        out.append((tuple(a), tuple(b)))
    return out


@dataclass(frozen=True)
class Candidate:
    layer: DerivedMatMul
    cost: PolicyCost
    peak_bytes: int
    modelled_forward_s: float
    modelled_backward_s: float
    fits: bool


def explore(m: int, k: int, n: int, mesh: Any, hardware: Any, dtype: Any = "float32",
            replicate_output: bool = False) -> list[Candidate]:
    """Every assignment whose dims divide evenly, ranked by modelled forward time (then backward).
    ``replicate_output``: compare them all producing a replicated C (else C keeps its derived layout)."""
    hardware = estimate_hardware(hardware)
    itemsize = np.dtype(dtype).itemsize
    out = []
    for a, b in assignments(mesh):
        if any(d % _size(mesh, ax) for d, ax in ((m, a[0]), (k, a[1]), (k, b[0]), (n, b[1]))):
            continue
        layer = derive(a, b, replicate_output)
        cost, peak = layer.cost(m, k, n, mesh, itemsize)
        out.append(Candidate(layer, cost, peak, modelled_estimate(cost.forward, mesh, hardware, dtype),
                             modelled_estimate(cost.backward, mesh, hardware, dtype),
                             peak <= hardware.device.memory_capacity))
    return sorted(
        out, key=lambda c: (c.modelled_forward_s, c.modelled_backward_s, c.peak_bytes, c.layer.name)
    )


def choose(m: int, k: int, n: int, mesh: Any, hardware: Any, dtype: Any = "float32", policy: str = "auto",
           replicate_output: bool = False) -> Candidate:
    """``policy="auto"``: the fastest candidate on ``hardware`` that fits its memory."""
    if policy != "auto":
        raise ShardingError(f"choose: unknown policy {policy!r}; expected 'auto'")
    hardware = estimate_hardware(hardware)
    for c in explore(m, k, n, mesh, hardware, dtype, replicate_output):
        if c.fits:
            return c
    raise ShardingError(f"no assignment of {mesh} to a {m}x{k} @ {k}x{n} matmul fits "
                        f"{nbytes(hardware.device.memory_capacity)} per device")
