"""Deterministic parameter initialisation from a seed (``numpy.random.default_rng``).

Uniform(−1/√fan_in, 1/√fan_in), the rule ``torch.nn.Linear`` and the recurrent layers use, so
models start at the same scale as their torch counterparts (not the same values).
"""

from __future__ import annotations

import numbers

from typing import Any

import numpy as np

from ..errors import UsageError

__all__ = ["uniform", "check_dtype"]


def check_dtype(layer: str, dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise UsageError(f"{layer}: parameters are float32 or float64, got dtype={dt}")
    return dt


def check_size(layer: str, name: str, value: Any, least: int = 0) -> int:
    """A layer's size argument as an int: refuses 2.5 (``int`` would make it 2), True and negatives."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise UsageError(f"{layer}: {name} must be an int >= {least}, got {value!r}")
    return int(value)


def uniform(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, dtype: np.dtype) -> np.ndarray:
    bound = 1.0 / np.sqrt(max(fan_in, 1))
    return rng.uniform(-bound, bound, size=shape).astype(dtype)
