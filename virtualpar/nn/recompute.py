"""Recomputed segments: keep a function's inputs for the backward, not what happens inside it.

For the backward autograd keeps whatever each numpy operation's vjp reads: a LayerNorm written
with ``autograd.numpy`` keeps its centred input, its normalised output and two statistics, a tanh
GELU five arrays the size of its input.  ``recomputed(fn, *args)`` runs ``fn(*args)`` untraced, so
the trace holds one node that keeps only ``args``; its backward runs ``fn`` again, traced, and
differentiates that (Chen et al. 2016's checkpointing at the scale of one kernel).  The backward
is still autograd's: nothing is written by hand.

Cost: the segment's forward runs twice.  The transformer layers wrap their elementwise parts in it
— the norms, the softmax, the MLP's activation: O(s·b·h) and O(a·s²·b) work next to the matmuls'
O(s·b·h²) — so that a block keeps exactly the tensors Korthikanti et al. (2022) count: each
kernel's input (:mod:`virtualpar.parallel.costs`).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from autograd.extend import defvjp_argnums, primitive

from ._autograd import record

__all__ = ["recomputed"]


@primitive
def _segment(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def _backward(argnums: tuple[int, ...], ans: Any, args: tuple, kwargs: dict) -> Callable[[Any], tuple]:
    fn, values = args[0], args[1:]

    def vjp(g: Any) -> tuple:
        _, back = record(fn, list(values), [i + 1 in argnums for i in range(len(values))])
        grads = back(g)
        return tuple(np.zeros_like(values[i - 1]) if grads[i - 1] is None else grads[i - 1] for i in argnums)
    return vjp


defvjp_argnums(_segment, _backward)


def recomputed(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, keeping only ``args`` for the backward, which runs ``fn`` again (see the module
    doc).  ``fn`` must be a pure function of its arguments (numpy only: it runs twice)."""
    return _segment(fn, *args)
