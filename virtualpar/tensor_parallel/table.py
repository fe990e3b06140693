"""The policy table: every named MatMul or FeedForward policy run once on a cluster, measured.

One :class:`PolicyRow` per policy: is the output right (vs numpy), which collectives ran, bytes
device↔device (sent per device) and host↔device, FLOPs and peak memory per device, wall time
here, modelled time from the devices' clocks, and the closed-form estimate beside it
(Σ collectives (steps·α + bytes/β) + FLOPs/peak, on the hardware's intra-node link).  Each
``execute`` runs with the weights already resident (placed once, before the timed call).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import ShardingError, UsageError
from .costs import PhaseCost, estimate_hardware, modelled_estimate
from .explore import choose, explore
from .explore_ffn import explore_ffn
from .execute import TensorParallelOp
from .ffn import FFN_POLICIES, FeedForward, FeedForwardShardingPolicy
from .matmul import MATMUL_POLICIES, MatMul, MatMulShardingPolicy

__all__ = ["PolicyRow", "policy_rows", "explore_rows", "modelled_estimate", "estimate_hardware", "build_op",
           "reference", "TOLERANCE", "check_shape_fits"]

#: max |error| / max |reference| allowed per dtype ("correct?" in the table)
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}


@dataclass(frozen=True)
class PolicyRow:
    policy: str
    layouts: str
    correct: bool
    rel_error: float
    collectives: tuple[str, ...]
    bytes_device_to_device: int
    bytes_host_to_device: int
    bytes_device_to_host: int
    flops_per_device: int
    peak_bytes_per_device: int
    wall_s: float
    modelled_s: float
    modelled_closed_form_s: float
    matches_closed_form: bool
    error: str = ""
    modelled_compute_s: float = 0.0  # of modelled_s, the slowest device's compute (its kernels' roofline)
    modelled_comm_s: float = 0.0  # the rest of modelled_s: its collectives, waits included

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON-safe fields: a policy that cannot apply (``error``) has ``correct`` and
        ``rel_error`` null — not false and NaN, which is no JSON at all."""
        d = asdict(self)
        d["collectives"] = list(self.collectives)
        if self.error:
            d["correct"] = d["rel_error"] = None
        elif not math.isfinite(self.rel_error):  # a NaN or inf result: JSON has no NaN
            d["rel_error"] = None
        return d


def _axes_of(mesh: Any, rank: int, group: tuple[int, ...]) -> str:
    for k in range(1, mesh.ndim + 1):
        for axes in itertools.combinations(mesh.axis_names, k):
            if mesh.group_of(rank, axes) == tuple(group):
                return ",".join(axes)
    return "?"


def build_op(name: str, mesh: Any, shape: tuple[int, ...], ffn: bool, hardware: Any = None,
             dtype: Any = "float32"):
    """(policy, op, input shapes) for a named policy at ``shape`` (m,k,n or b,s,m,h); "auto" (MatMul
    only) is the explorer's fastest candidate on ``hardware`` that fits its memory."""
    if ffn:
        b, s, m, h = shape
        policy = FeedForwardShardingPolicy.named(name, mesh)
        policy.check(b, s, m, h, mesh)
        shapes = ((b, s, m), (m, h), (h,), (h, m), (m,))
        return policy, TensorParallelOp(FeedForward(policy), shapes, (b, s, m), weights=(1, 2, 3, 4)), shapes
    m, k, n = shape
    if name == "auto":  # the explorer's pick on the cluster's hardware, C replicated like most named policies
        layer = choose(m, k, n, mesh, hardware, dtype, replicate_output=True).layer
        return _Auto(layer), TensorParallelOp(layer, ((m, k), (k, n)), (m, n), weights=(1,)), ((m, k), (k, n))
    policy = MatMulShardingPolicy.named(name, mesh)
    policy.check(m, k, n, mesh)
    return policy, TensorParallelOp(MatMul(policy), ((m, k), (k, n)), (m, n), weights=(1,)), ((m, k), (k, n))


@dataclass(frozen=True)
class _Auto:
    """The explorer's candidate seen as a policy (its str and its cost) for the table."""

    layer: Any

    def __str__(self) -> str:
        return f"auto: {self.layer.name} -> C{self.layer.output_layout()}"

    def cost(self, m: int, k: int, n: int, mesh: Any, itemsize: int):
        return self.layer.cost(m, k, n, mesh, itemsize)[0]


def reference(inputs: list[np.ndarray], ffn: bool) -> np.ndarray:
    if ffn:
        x, w1, b1, w2, b2 = inputs
        return np.maximum(x @ w1 + b1, 0) @ w2 + b2
    return inputs[0] @ inputs[1]


def _in_shapes(shape: tuple[int, ...], ffn: bool) -> tuple[tuple[int, ...], ...]:
    return ((shape[0], shape[1], shape[2]), (shape[2], shape[3]), (shape[3],), (shape[3], shape[2]),
            (shape[2],)) \
        if ffn else ((shape[0], shape[1]), (shape[1], shape[2]))


def check_shape_fits(shape: tuple[int, ...], ffn: bool = False, dtype: Any = np.float32) -> None:
    """Refuse, before anything is allocated, a shape whose arrays cannot fit in this machine's memory.

    What a table run holds at least: in the driver the inputs, numpy's reference output and the
    gathered output; on the devices together, every input and output once more (shards add up to at
    least the whole).  So ``2 * (inputs + 2 * output) * itemsize`` bytes must be below the memory
    available now (``sysmem.physical_available``): a 1e8-cubed MatMul asked for 35.5 PiB and ended
    in numpy's raw ``_ArrayMemoryError``."""
    from ..sysmem import gib, physical_available

    itemsize = np.dtype(dtype).itemsize
    out = (shape[0], shape[1], shape[2]) if ffn else (shape[0], shape[2])
    inputs = sum(math.prod(s) for s in _in_shapes(shape, ffn))
    need = 2 * (inputs + 2 * math.prod(out)) * itemsize
    have = physical_available()
    if need > have:
        what = "FeedForward b,s,m,h" if ffn else "MatMul m,k,n"
        raise UsageError(f"shape {what} = {tuple(shape)} in {np.dtype(dtype)} needs about {gib(need)} of "
                         "memory (the inputs and outputs in the driver, with numpy's "
                         "reference, and once more "
                         f"on the devices) but this machine has {gib(have)} available; use a smaller shape")


def _inputs(shape: tuple[int, ...], ffn: bool, dtype: np.dtype, seed: int) -> list[np.ndarray]:
    check_shape_fits(shape, ffn, dtype)
    rng = np.random.default_rng(seed)
    in_shapes = _in_shapes(shape, ffn)
    return [rng.standard_normal(s, dtype=np.float32).astype(dtype) for s in in_shapes]


def policy_rows(cluster: Any, shape: tuple[int, ...], ffn: bool = False, dtype: Any = np.float32,
                names: tuple[str, ...] | None = None, seed: int = 0, progress: Any = None) -> list[PolicyRow]:
    """Run every named policy (or ``names``) once on ``cluster`` and measure it; ``progress()``, if
    given, is called after each policy (a command's progress bar: the library draws nothing)."""
    mesh, hw = cluster.mesh, cluster.hardware
    dtype = np.dtype(dtype)
    names = names or (tuple(FFN_POLICIES) if ffn else (*MATMUL_POLICIES, "auto"))
    inputs = _inputs(shape, ffn, dtype, seed)
    want = reference(inputs, ffn)
    rows = []
    for name in names:
        try:
            policy, op, _ = build_op(name, mesh, shape, ffn, hw, dtype)
        except ShardingError as exc:
            rows.append(PolicyRow(name, "-", False, float("nan"), (), 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, False,
                                  str(exc)))
            if progress is not None:
                progress()
            continue
        rows.append(_measure(cluster, name, str(policy).split(": ", 1)[1],
                             policy.cost(*shape, mesh, dtype.itemsize).forward, op, inputs, want, dtype))
        if progress is not None:
            progress()
    return rows


def explore_rows(cluster: Any, shape: tuple[int, ...], ffn: bool = False, dtype: Any = np.float32,
                 seed: int = 0, limit: int | None = None, progress: Any = None) -> list[PolicyRow]:
    """The explorer's candidates (MatMul: every assignment of mesh axes to A's and B's dims, C
    replicated; FFN: every policy x role assignment), fastest modelled first, each run once,
    checked against numpy and measured.  ``limit``: only the first ``limit`` of the ranking.
    ``progress(total)``, if given, is called once with the number of candidates, then
    ``progress()`` after each."""
    mesh, hw = cluster.mesh, cluster.hardware
    dtype = np.dtype(dtype)
    inputs = _inputs(shape, ffn, dtype, seed)
    want = reference(inputs, ffn)
    rows = []
    tick = progress or (lambda total=None: None)
    if ffn:
        candidates = explore_ffn(*shape, mesh, hw, dtype)[:limit]
        tick(len(candidates))
        for c in candidates:
            b, s, m, h = shape
            op = TensorParallelOp(FeedForward(c.policy), ((b, s, m), (m, h), (h,), (h, m), (m,)), (b, s, m),
                                  weights=(1, 2, 3, 4))
            roles = ",".join(f"{k}={'+'.join(v)}" for k, v in c.policy.roles)
            rows.append(_measure(cluster, f"{c.policy.name}({roles})", str(c.policy).split(": ", 1)[1],
                                 c.cost.forward, op, inputs, want, dtype))
            tick()
        return rows
    m, k, n = shape
    candidates = explore(m, k, n, mesh, hw, dtype, replicate_output=True)[:limit]
    tick(len(candidates))
    for c in candidates:
        op = TensorParallelOp(c.layer, ((m, k), (k, n)), (m, n), weights=(1,))
        rows.append(_measure(cluster, c.layer.name, f"{c.layer.name} -> C{c.layer.output_layout()}",
                             c.cost.forward, op, inputs, want, dtype))
        tick()
    return rows


def _measure(cluster: Any, name: str, layouts: str, closed: PhaseCost, op: TensorParallelOp,
             inputs: list[np.ndarray], want: np.ndarray, dtype: np.dtype) -> PolicyRow:
    """Place the weights, run one execute, and read what it did from the cluster.  The execute
    measured is the second: the first one's one-time allocations (caches, buffers, imports) made
    the first row's peak memory up to 80x the next identical program's."""
    mesh, hw = cluster.mesh, cluster.hardware
    op.place_weights(cluster, *(inputs[i] for i in op.weights))
    acts = [inputs[i] for i in range(len(inputs)) if i not in op.weights]
    cluster.execute(op, *acts)
    cluster.reset_stats()
    cluster.clear_trace()
    before = cluster.clocks()
    t0 = time.perf_counter()
    out = cluster.execute(op, *acts)
    wall = time.perf_counter() - t0
    after = cluster.clocks()
    modelled = max(after) - max(before)
    st = cluster.stats()
    events = [e for e in cluster.trace() if e.kind in ("collective", "compute")]
    slowest = max(range(mesh.size), key=lambda r: after[r])
    compute_s = min(modelled, sum(e.duration("model") for e in events
                                  if e.kind == "compute" and e.rank == slowest))
    flops = [0.0] * mesh.size
    for e in events:
        if e.kind == "compute":
            flops[e.rank] += float(e.arg("flops", 0.0))
    colls = tuple(
        f"{e.name}({_axes_of(mesh, 0, e.group)})" for e in events if e.kind == "collective" and e.rank == 0
    )
    peak = max(op.peak_bytes(cluster))
    rel = float(np.abs(out - want).max() / np.abs(want).max())
    ok_closed = all(st.sent(r) == closed.bytes_sent for r in range(mesh.size)) and all(
        f == closed.flops for f in flops
    )
    return PolicyRow(
        policy=name, layouts=layouts, correct=bool(rel <= TOLERANCE.get(dtype.name, 1e-5)),
        rel_error=rel, collectives=colls, bytes_device_to_device=max(st.sent(r) for r in range(mesh.size)),
        bytes_host_to_device=int(st.host_to_device.sum()), bytes_device_to_host=int(st.device_to_host.sum()),
        flops_per_device=int(max(flops)), peak_bytes_per_device=int(peak), wall_s=wall, modelled_s=modelled,
        modelled_closed_form_s=modelled_estimate(closed, mesh, hw, dtype), matches_closed_form=ok_closed,
        modelled_compute_s=compute_s, modelled_comm_s=max(0.0, modelled - compute_s))
