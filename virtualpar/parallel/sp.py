"""Sequence parallelism's gathered linear: keep the sequence shard, gather it again in the backward.

Korthikanti et al. 2022 (§4.2.2): under sequence parallelism a column-parallel linear reads the
whole sequence, all-gathered from the tp ranks' shards.  Kept for the backward, that gathered input
would be t times the shard; Megatron-LM keeps the shard and all-gathers it again when the weight
gradient needs it, so every activation of the layer is divided by t.  This primitive does that:

    forward   y = all_gather(x, seq) · W + b                    one all_gather of (t−1)/t·b·s·h
    backward  dx = reduce_scatter(dy · Wᵀ, seq)                 one reduce_scatter
              dW = all_gather(x, seq)ᵀ · dy                     the all_gather again
              db = Σ dy

so a step moves one more all_gather of b·s·h per gathered linear than an all_gather kept for the
backward would (:func:`virtualpar.parallel.costs.tp_bytes` counts it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from autograd.extend import defvjp, primitive

__all__ = ["gathered_affine"]


def _gather(x: np.ndarray, dev: Any) -> np.ndarray:
    return dev.all_gather(np.ascontiguousarray(x), dim=1, group="tp")


def _rows(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1])


@primitive
def gathered_affine(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, dev: Any) -> np.ndarray:
    """``all_gather(x, seq) @ weight + bias`` for x (batch, s/t, in), weight (in, out/t)."""
    y = _gather(x, dev) @ weight
    if bias is not None:
        y += bias
    return y


def _dx(ans: Any, x: np.ndarray, weight: np.ndarray, bias: Any, dev: Any):
    return lambda g: dev.reduce_scatter(np.ascontiguousarray(g @ weight.T), dim=1, op="sum", group="tp")


def _dw(ans: Any, x: np.ndarray, weight: np.ndarray, bias: Any, dev: Any):
    return lambda g: _rows(_gather(x, dev)).T @ _rows(g)


def _db(ans: Any, x: np.ndarray, weight: np.ndarray, bias: Any, dev: Any):
    return lambda g: _rows(g).sum(axis=0)


defvjp(gathered_affine, _dx, _dw, _db)
