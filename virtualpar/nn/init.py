"""Deterministic parameter initialisation from a seed (``numpy.random.default_rng``).

Uniform(−1/√fan_in, 1/√fan_in), the rule ``torch.nn.Linear`` and the recurrent layers use, so
models start at the same scale as their torch counterparts (not the same values).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import UsageError

__all__ = ["uniform", "check_dtype"]


def check_dtype(layer: str, dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise UsageError(f"{layer}: parameters are float32 or float64, got dtype={dt}")
    return dt


def uniform(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, dtype: np.dtype) -> np.ndarray:
    bound = 1.0 / np.sqrt(max(fan_in, 1))
    return rng.uniform(-bound, bound, size=shape).astype(dtype)
