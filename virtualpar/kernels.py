"""numpy kernels that charge their cost to a device's modelled clock as they run.

Each kernel computes with numpy and charges ``device.compute(flops, bytes)``, i.e. the roofline
``max(flops / peak, bytes / memory bandwidth)`` of the device's hardware spec.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import UsageError

__all__ = ["matmul", "matmul_cost"]


def matmul_cost(a_shape: tuple[int, ...], b_shape: tuple[int, ...], itemsize: int) -> tuple[float, float]:
    """(flops, bytes) of ``(..., m, k) @ (k, n)``: 2·m·n·k flops per batch; reads A and B, writes C once."""
    *batch, m, k = a_shape
    k2, n = b_shape[-2:]
    if k != k2:
        raise UsageError(f"matmul: inner dimensions differ: {tuple(a_shape)} @ {tuple(b_shape)}")
    count = int(np.prod(batch)) if batch else 1
    flops = 2.0 * count * m * n * k
    nbytes = float(itemsize * (count * m * k + k * n + count * m * n))
    return flops, nbytes


def matmul(device: Any, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` on ``device``, charging 2mnk flops (and the bytes it touches) to its modelled clock."""
    if a.ndim < 2 or b.ndim != 2:
        raise UsageError(f"matmul: expected (..., m, k) @ (k, n), got shapes {a.shape} and {b.shape}")
    flops, nbytes = matmul_cost(a.shape, b.shape, np.result_type(a, b).itemsize)
    began = device.wall
    out = a @ b
    device.compute(flops=flops, bytes=nbytes, dtype=out.dtype, name="matmul", since=began)  # the slice covers a @ b
    return out
