"""Differentiable collectives and charged local kernels: autograd primitives over the device protocol.

A sharded layer is written once, as a forward program on one device with ``autograd.numpy`` and
the primitives below; its backward is ``autograd.make_vjp`` of that program.  Each collective's
vector-Jacobian product is another collective, so the backward's communication comes from
composition and cannot drift from the forward (Megatron-LM, arXiv 1909.08053, §3; JAX's
``shard_map`` transposes the same way).

Cotangent convention (what a value on a device means, and what its cotangent means)
-----------------------------------------------------------------------------------
L is one global scalar.  Each array a device holds is either

* **invariant** over a group: identical on every member, and standing for *one* logical tensor X
  that every member consumes *identically*.  Its cotangent is invariant too: every member holds the
  full ∂L/∂X (not ∂L/∂X / n, and not a share of it).  A replicated *output* of a layer is
  invariant: the caller passes the same cotangent dY on every device.
* **varying** over a group: member r holds its own value, or its own copy of a logical tensor it
  consumes differently from the other members.  Its cotangent on r is r's *contribution*
  ∂L_r/∂x_r; when the value is a copy of one logical tensor X, ∂L/∂X = Σ_r ∂L_r/∂x_r (the sum of
  the per-device contributions, never their mean).

Each primitive converts between the two, and its vjp is the transpose (ring costs for a group of n,
M = bytes of the array that is the larger side of the collective)::

    primitive                 forward                  backward (vjp)             bytes sent/device fwd | bwd
    f(x)       invariant→varying  identity                 all_reduce (sum)        0 | 2(n−1)/n·M
    g(x)       varying→invariant  all_reduce (sum)         identity                2(n−1)/n·M | 0
    all_gather(x, d)   shards→varying copies   reduce_scatter (sum) on d   (n−1)/n·M | (n−1)/n·M
    all_gather_invariant(x, d)  shards→invariant   local slice of d         (n−1)/n·M | 0
    reduce_scatter(x, d)  varying partials→shards   all_gather on d          (n−1)/n·M | (n−1)/n·M
    all_to_all(x, s, c)   shard c → shard s        all_to_all(c, s)         (n−1)/n·M | (n−1)/n·M

So "the gradient of a replicated input is the sum of the per-device contributions" is exactly
what ``f``'s backward computes, and "a replicated output's cotangent is taken as identical on
every device" is what ``g``'s backward assumes.  Use ``all_gather`` when the gathered copies feed
different computations on different members (sequence parallelism; GSPMD), and
``all_gather_invariant`` when every member computes the same thing from them; choosing wrong gives
gradients n times too large, which the tests against numpy catch.

Local kernels (``matmul``, ``add_bias``, ``relu``) charge ``dev.compute(flops=, bytes=)`` in the
forward *and* in the backward, so FLOPs per device can be read from the trace and compared with the
closed forms of the policies.  Counting convention: a matmul (m, k)·(k, n) is 2mnk flops; bias
add, ReLU, the ReLU mask in the backward and each element summed into a bias gradient are 1 flop
per element.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from autograd.extend import defvjp, primitive

from ..collectives.selection import SHM_MIN_BYTES
from ..collectives.shm import split_bounds
from ..errors import ShardingError

__all__ = [
    "f", "g", "all_gather", "all_gather_invariant", "reduce_scatter", "all_to_all",
    "matmul", "add_bias", "relu", "local_slice", "KERNEL_LOG",
]


def _reduce_algorithm(x: np.ndarray) -> str | None:
    """Below the shared-memory threshold the runtime would pick a binomial tree, whose bytes per
    device are uneven; the ring keeps the per-device closed form 2(n−1)/n·M exact at every size
    (the shm algorithm used above the threshold is counted as the ring)."""
    return "ring" if x.nbytes < SHM_MIN_BYTES else None


KERNEL_LOG = "tp.kernels"


def _log(dev: Any, kind: str, *arrays: np.ndarray) -> None:
    """Record a local kernel (kind, shapes, dtype) when ``dev.state[KERNEL_LOG]`` is a list: the
    benchmark replays these in one process to time the floor of a policy."""
    log = dev.state.get(KERNEL_LOG)
    if log is not None:
        log.append((kind, tuple(a.shape for a in arrays), str(arrays[0].dtype)))


def local_slice(x: np.ndarray, dev: Any, dim: int, group: Any) -> np.ndarray:
    """This device's piece of ``x`` split along ``dim`` over ``group`` (position = group rank), as
    ``numpy.array_split`` and the runtime's scatter / reduce_scatter split it: the first
    ``x.shape[dim] mod n`` pieces one longer (``x.shape[dim] // n`` dropped the remainder)."""
    bounds = split_bounds(x.shape[dim], len(dev.group(group)))
    r = dev.group_rank(group)
    index = [slice(None)] * x.ndim
    index[dim] = slice(bounds[r], bounds[r + 1])
    return x[tuple(index)]


def _own_piece(dy: np.ndarray, x: np.ndarray, dev: Any, dim: int, group: Any) -> np.ndarray:
    """all_gather_invariant's backward: this member's rows of the gathered cotangent.  Where they
    lie is known for pieces laid out as ``numpy.array_split``'s (equal ones included); other
    uneven pieces are refused, not answered with another member's rows."""
    piece = local_slice(dy, dev, dim, group)
    if piece.shape[dim] != x.shape[dim]:
        raise ShardingError(f"{dev.name}: all_gather_invariant of pieces of uneven "
                            f"size along dim {dim} (this "
                            f"member's: {x.shape[dim]} of {dy.shape[dim]}): its "
                            "backward needs them laid out as "
                            "numpy.array_split lays them out (the first ones one longer)")
    return np.ascontiguousarray(piece)


# -- Megatron's conjugate pair --------------------------------------------------------------------
@primitive
def f(x: np.ndarray, dev: Any, group: Any) -> np.ndarray:
    """Identity forward (invariant → varying); all_reduce of the contributions backward."""
    return x


@primitive
def g(x: np.ndarray, dev: Any, group: Any) -> np.ndarray:
    """all_reduce (sum) forward (varying partials → invariant); identity backward."""
    return dev.all_reduce(x, op="sum", group=group, algorithm=_reduce_algorithm(x))


defvjp(f, lambda ans, x, dev,
       group: lambda dy: dev.all_reduce(dy, op="sum", group=group, algorithm=_reduce_algorithm(dy)))
defvjp(g, lambda ans, x, dev, group: lambda dy: dy)


# -- gathers, scatters ---------------------------------------------------------------------------
@primitive
def all_gather(x: np.ndarray, dev: Any, dim: int, group: Any) -> np.ndarray:
    """Concatenate the members' shards along ``dim`` (varying copies); backward reduce_scatter."""
    return dev.all_gather(x, dim=dim, group=group)


@primitive
def all_gather_invariant(x: np.ndarray, dev: Any, dim: int, group: Any) -> np.ndarray:
    """Concatenate the shards along ``dim`` into an invariant value; backward takes the local slice."""
    return dev.all_gather(x, dim=dim, group=group)


@primitive
def reduce_scatter(x: np.ndarray, dev: Any, dim: int, group: Any) -> np.ndarray:
    """Sum the members' partials and keep this member's slice of ``dim``; backward all_gather."""
    return dev.reduce_scatter(x, dim=dim, op="sum", group=group)


@primitive
def all_to_all(x: np.ndarray, dev: Any, split_dim: int, concat_dim: int, group: Any) -> np.ndarray:
    """Re-shard from ``concat_dim`` to ``split_dim``; backward re-shards back (its transpose)."""
    return dev.all_to_all(x, split_dim=split_dim, concat_dim=concat_dim, group=group)


def _scattered_back(dy: np.ndarray, x: np.ndarray, dev: Any, dim: int, group: Any) -> np.ndarray:
    """all_gather's backward: the reduce_scatter of the cotangents, which splits as
    ``numpy.array_split`` does; pieces laid out otherwise would get another member's rows."""
    piece = dev.reduce_scatter(dy, dim=dim, op="sum", group=group)
    if piece.shape[dim] != x.shape[dim]:
        raise ShardingError(f"{dev.name}: all_gather of pieces of uneven size along "
                            f"dim {dim} (this member's: "
                            f"{x.shape[dim]} of {dy.shape[dim]}): its backward needs them laid out as "
                            "numpy.array_split lays them out (the first ones one longer)")
    return piece


defvjp(all_gather, lambda ans, x, dev, dim, group: lambda dy: _scattered_back(dy, x, dev, dim, group))
defvjp(all_gather_invariant, lambda ans, x, dev, dim, group: lambda dy: _own_piece(dy, x, dev, dim, group))
defvjp(reduce_scatter, lambda ans, x, dev, dim, group: lambda dy: dev.all_gather(dy, dim=dim, group=group))
defvjp(all_to_all, lambda ans, x, dev, s, c,
       group: lambda dy: dev.all_to_all(dy, split_dim=c, concat_dim=s, group=group))


# -- local kernels that charge the modelled clock ------------------------------------------------
@primitive
def matmul(a: np.ndarray, b: np.ndarray, dev: Any) -> np.ndarray:
    """``a @ b`` for (..., m, k)·(k, n) or (m, k)·(k, n), charging 2·m·n·k flops (batch included).

    Backward: dA = dC·Bᵀ and dB = Aᵀ·dC (batch dims summed), each charged as a matmul."""
    _log(dev, "matmul", a, b)
    return dev.matmul(a, b)


def _matmul_db(ans: np.ndarray, a: np.ndarray, b: np.ndarray, dev: Any):
    def vjp(dy: np.ndarray) -> np.ndarray:
        a2 = a.reshape(-1, a.shape[-1])
        return dev.matmul(np.ascontiguousarray(a2.T), dy.reshape(-1, dy.shape[-1]))
    return vjp


defvjp(matmul, lambda ans, a, b, dev: lambda dy: dev.matmul(dy, np.ascontiguousarray(b.T)), _matmul_db)


@primitive
def add_bias(x: np.ndarray, b: np.ndarray, dev: Any) -> np.ndarray:
    """``x + b`` (b broadcast over the leading dims): x.size flops."""
    dev.compute(flops=x.size, bytes=(2 * x.size + b.size) * x.itemsize, dtype=x.dtype, name="add_bias")
    _log(dev, "add_bias", x, b)
    return x + b


def _bias_grad(ans: np.ndarray, x: np.ndarray, b: np.ndarray, dev: Any):
    def vjp(dy: np.ndarray) -> np.ndarray:
        dev.compute(flops=dy.size, bytes=(dy.size + b.size) * dy.itemsize, dtype=dy.dtype, name="bias_grad")
        return dy.reshape(-1, dy.shape[-1]).sum(axis=0)
    return vjp


defvjp(add_bias, lambda ans, x, b, dev: lambda dy: dy, _bias_grad)


@primitive
def relu(x: np.ndarray, dev: Any) -> np.ndarray:
    """max(x, 0): x.size flops; backward dy·[x > 0]: x.size flops."""
    dev.compute(flops=x.size, bytes=2 * x.size * x.itemsize, dtype=x.dtype, name="relu")
    _log(dev, "relu", x)
    return np.maximum(x, 0)


def _relu_grad(ans: np.ndarray, x: np.ndarray, dev: Any):
    def vjp(dy: np.ndarray) -> np.ndarray:
        dev.compute(flops=dy.size, bytes=3 * dy.size * dy.itemsize, dtype=dy.dtype, name="relu_grad")
        return dy * (x > 0)
    return vjp


defvjp(relu, _relu_grad)
