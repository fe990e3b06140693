"""numpy kernels that charge their cost to a device's modelled clock as they run.

Each kernel computes with numpy and charges ``device.compute(flops, bytes)``, i.e. the roofline
``max(flops / peak, bytes / memory bandwidth)`` of the device's hardware spec.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import UsageError

__all__ = ["matmul", "matmul_cost", "matmul_flops", "matmul_backward_flops"]


def matmul_flops(m: int, k: int, n: int, count: int = 1) -> int:
    """FLOPs of ``count`` products ``(m, k) @ (k, n)``: ``2·m·k·n`` each, one multiply and one add
    per term.  The one definition every cost in virtualpar reads (an int for int shapes)."""
    return 2 * count * m * k * n


def matmul_backward_flops(m: int, k: int, n: int, count: int = 1) -> tuple[int, int]:
    """FLOPs of the backward of ``C = A·B`` with A ``(m, k)``, B ``(k, n)``: ``(input part, weight
    part)`` = ``(dA = dC·Bᵀ, dB = Aᵀ·dC)``, each ``2·m·k·n``, so the backward is twice the forward."""
    return matmul_flops(m, n, k, count), matmul_flops(k, m, n, count)


def matmul_cost(a_shape: tuple[int, ...], b_shape: tuple[int, ...], itemsize: int) -> tuple[float, float]:
    """(flops, bytes) of ``(..., m, k) @ (k, n)``: 2·m·n·k flops per batch; reads A and B, writes C once."""
    *batch, m, k = a_shape
    k2, n = b_shape[-2:]
    if k != k2:
        raise UsageError(f"matmul: inner dimensions differ: {tuple(a_shape)} @ {tuple(b_shape)}")
    count = int(np.prod(batch)) if batch else 1
    flops = float(matmul_flops(m, k, n, count))
    nbytes = float(itemsize * (count * m * k + k * n + count * m * n))
    return flops, nbytes


def matmul(device: Any, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` on ``device``, charging 2mnk flops (and the bytes it touches) to its modelled clock."""
    if a.ndim < 2 or b.ndim != 2:
        raise UsageError(f"matmul: expected (..., m, k) @ (k, n), got shapes {a.shape} and {b.shape}")
    flops, nbytes = matmul_cost(a.shape, b.shape, np.result_type(a, b).itemsize)
    began = device.wall
    out = a @ b
    device.compute(
        flops=flops, bytes=nbytes, dtype=out.dtype, name="matmul", since=began
    )  # the slice covers a @ b
    return out
