"""Reduce operations for the collectives: an explicit registry, in-place combine, and finalize.

A reduction ``x_0 ⊕ x_1 ⊕ … ⊕ x_{n-1}`` is computed by the algorithms as a sequence of binary
``combine(op, acc, incoming)`` steps (``acc ← acc ⊕ incoming``, in place, no allocation) followed
by one ``finalize(op, acc, n)`` (the identity except for ``avg``, which divides the sum by ``n``).

Bit-identical results on every device.  IEEE ``+`` and ``*`` are commutative but not associative,
and ``maximum``/``minimum`` are not even bit-commutative: ``np.maximum(-0.0, 0.0)`` is ``0.0`` while
``np.maximum(0.0, -0.0)`` is ``-0.0``, and of two NaNs the first operand's payload wins.  So the
algorithms either compute every element of the result exactly once and copy it to the other devices
(ring, binomial reduce), or make every device evaluate the same expression tree with the same operand
order (recursive doubling combines ``lower-rank ⊕ higher-rank`` on both partners; direct sums in rank
order).  ``finalize`` is elementwise and deterministic, so it preserves bit-identity.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from virtualpar.errors import UsageError

__all__ = ["ReduceOp", "REDUCE_OPS", "check_op", "combine", "finalize", "premultiplies", "premultiply",
           "reduce_floats"]


@dataclass(frozen=True)
class ReduceOp:
    """A named elementwise reduction: the binary ufunc and whether integer dtypes are allowed.

    ``average`` marks ``avg``: reduced with ``add``, then divided by the group size at the end.
    """

    name: str
    ufunc: Callable[..., np.ndarray]
    average: bool = False


REDUCE_OPS: dict[str, ReduceOp] = {
    "sum": ReduceOp("sum", np.add),
    "prod": ReduceOp("prod", np.multiply),
    "max": ReduceOp("max", np.maximum),
    "min": ReduceOp("min", np.minimum),
    "avg": ReduceOp("avg", np.add, average=True),
}


#: dtype kinds each op is defined on (MPI defines its ops on numbers; timedeltas add, datetimes compare)
_KINDS = {"sum": "biufcm", "prod": "biufc", "max": "biufcmM", "min": "biufcmM", "avg": "fc"}


def check_op(op: str, dtype: np.dtype | type | str) -> ReduceOp:
    """Return the registered ``ReduceOp`` for ``op``; raise ``UsageError`` if it is unknown or unfit.

    ``avg`` needs an inexact dtype (float or complex): an integer average would silently truncate.
    Every op needs numbers (strings would concatenate); timedelta64 adds and compares, datetime64
    only compares.  ``avg`` of float16 is summed as ``x/n`` (see ``collective_call``): its plain
    sum overflows past 65504.
    """
    try:
        spec = REDUCE_OPS[op]
    except (KeyError, TypeError):
        raise UsageError(
            f"unknown reduce op {op!r}: expected one of {sorted(REDUCE_OPS)}", op=op
        ) from None
    dt = np.dtype(dtype)
    if spec.average and dt.kind in "biu":
        what = "integers is not an integer" if dt.kind in "iu" else f"{dt} values is not one"
        raise UsageError(
            f"reduce op 'avg' on dtype {dt}: the average of {what}; "
            f"use op='sum' and divide yourself, or cast to a float dtype first",
            op=op,
            dtype=str(dt),
        )
    if dt.kind not in _KINDS.get(op, "biufc"):  # numpy would concatenate strings, or fail deep inside
        also = " (and timedelta64 for sum, max, min)" if dt.kind in "mM" else ""
        raise UsageError(f"reduce op {op!r} is not defined on dtype {dt}; reductions take bool, integer, "
                         f"float or complex arrays{also}", op=op, dtype=str(dt))
    return spec


def combine(op: str, acc: np.ndarray, incoming: np.ndarray) -> np.ndarray:
    """``acc ← acc ⊕ incoming`` in place (``acc`` is the first operand); returns ``acc``.

    ``acc`` must be a writable array owned by the caller; ``incoming`` is only read.
    """
    REDUCE_OPS[op].ufunc(acc, incoming, out=acc)
    return acc


def finalize(op: str, acc: np.ndarray, n: int) -> np.ndarray:
    """Finish a reduction of ``n`` contributions in place (``avg``: divide by n); returns ``acc``."""
    if REDUCE_OPS[op].average and n != 1:
        np.divide(acc, n, out=acc)
    return acc


def premultiplies(op: str, dtype: np.dtype | type | str, n: int) -> bool:
    """Is this ``avg`` summed as ``x/n`` (NCCL's PreMulSum)?  For float16: the sum of n inputs
    overflows past 65504 where their mean fits.  Both backends ask here, so they agree."""
    return op == "avg" and n > 1 and np.dtype(dtype) == np.float16


def premultiply(x: np.ndarray, n: int) -> np.ndarray:
    """``x/n`` in float16, the input of a premultiplied average (then reduced with ``sum``)."""
    return np.multiply(x, 1.0 / n, dtype=np.float16)


def reduce_floats(op: str, values: Iterable[float], n: int) -> float:
    """The members' float64 values (as Python floats, in rank order) reduced left to right and
    finalized: the very bits that ``ufunc`` steps in float64 and ``finalize`` give — Python's float
    arithmetic is IEEE double, and max/min choose as ``np.maximum``/``np.minimum`` do,
    signed zeros and NaNs included (tests/test_reduce_ops.py checks every combination of them).
    For one number per member this makes no numpy call, where the array path makes seven, each
    ~5–12 µs of a device's CPU once its caches have gone cold, as they have after every wake-up
    with more devices than cores (paired blocks of a barrier and a one-float all_reduce at 64
    devices on two cores: the array path took 0.97–1.13×, median 1.06×, this one's CPU)."""
    it = iter(values)
    acc = next(it)
    if op == "max":  # np.maximum(acc, v): a NaN acc stays; else the larger, and v when they are equal
        for v in it:
            if not (acc > v or acc != acc):
                acc = v
    elif op == "min":
        for v in it:
            if not (acc < v or acc != acc):
                acc = v
    else:  # (a C loop of IEEE double operations, left to right)
        acc = functools.reduce(operator.mul if op == "prod" else operator.add, it, acc)
    return acc / n if REDUCE_OPS[op].average and n != 1 else acc
