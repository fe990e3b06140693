"""Elementwise activations (no parameters); each is a ``Module`` and a plain function.

GELU exact: ``x·Φ(x) = ½x(1 + erf(x/√2))``; tanh approximation (Hendrycks & Gimpel 2016):
``½x(1 + tanh(√(2/π)(x + 0.044715x³)))``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from autograd.extend import defvjp, primitive
from scipy.special import erf

from ..errors import UsageError
from .module import Module

__all__ = ["ReLU", "GELU", "Tanh", "relu", "gelu", "tanh"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@primitive
def relu(x: Any) -> Any:
    """``max(x, 0)`` as one autograd primitive with backward ``dy·[y > 0]``: one node and two
    elementwise passes each way (as ``x * (x > 0)`` it took two nodes, a bool-to-float cast and a
    broadcasting helper; autograd's ``maximum`` would hand back float64 gradients for float32)."""
    return np.maximum(x, 0)


defvjp(relu, lambda y, x: lambda g: np.multiply(g, y > 0, dtype=np.result_type(g, y)))


def gelu(x: Any, approximate: str = "none") -> Any:
    """GELU: exact ``½x(1 + erf(x/√2))`` with ``approximate="none"``, ``½x(1 + tanh(√(2/π)(x + 0.044715x³)))``
    with ``"tanh"`` (torch.nn.functional.gelu).

    One autograd primitive that keeps only its input for the backward, ``dy·GELU′(x)``, as
    Megatron-LM's fused bias-GeLU kernel does:  ``GELU′(x) = Φ(x) + x·φ(x)`` (exact), and
    ``½(1 + t) + ½x(1 − t²)·√(2/π)(1 + 3·0.044715x²)`` with ``t`` the tanh above.  Traced op by op,
    autograd kept three more arrays of the input's size (the tanh, ½x and 1 + tanh).  x³ is x·x·x:
    numpy's ``x ** 3`` of float32 took 100 times as long."""
    if approximate not in ("none", "tanh"):
        raise UsageError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _gelu(x, approximate == "tanh")


@primitive
def _gelu(x: np.ndarray, tanh_form: bool) -> np.ndarray:
    if tanh_form:
        return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x))))
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _gelu_slope(x: np.ndarray, tanh_form: bool) -> np.ndarray:
    """GELU′(x), see :func:`gelu`."""
    if tanh_form:
        t = np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x)))
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (_SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x))
    return 0.5 * (1.0 + erf(x / math.sqrt(2.0))) + x * (np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi))


defvjp(_gelu, lambda y, x, tanh_form: lambda g: g * _gelu_slope(x, tanh_form))


@primitive
def tanh(x: Any) -> Any:
    """``tanh(x)`` with backward ``dy·(1 − y²)``, as torch computes it (autograd's ``dy / cosh(x)²``
    overflows, with a RuntimeWarning, once |x| passes ~44 in float32)."""
    return np.tanh(x)


defvjp(tanh, lambda y, x: lambda g: g * (1 - y * y))


class ReLU(Module):
    """``max(x, 0)`` elementwise (torch.nn.ReLU)."""

    def forward(self, x: Any) -> Any:
        return relu(x)


class GELU(Module):
    """GELU elementwise, see :func:`gelu`; ``approximate``: ``"none"`` (erf) or ``"tanh"`` (torch.nn.GELU)."""

    def __init__(self, approximate: str = "none") -> None:
        if approximate not in ("none", "tanh"):
            raise UsageError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Any) -> Any:
        return gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Tanh(Module):
    """``tanh(x)`` elementwise, backward ``dy·(1 − y²)`` (torch.nn.Tanh)."""

    def forward(self, x: Any) -> Any:
        return tanh(x)
