"""Normalisation over the last dimension: ``LayerNorm`` (Ba, Kiros & Hinton 2016) and ``RMSNorm``
(Zhang & Sennrich 2019).

``LayerNorm``: ``y = (x − μ) / √(σ² + ε) · γ + β`` with μ, σ² the mean and (biased) variance of the last dim.
``RMSNorm``:   ``y = x / √(mean(x²) + ε) · γ`` (no centring, no bias).

Both are per-token and O(d) FLOPs per token (about 7·d and 4·d): negligible next to the matmuls.
Each keeps only its input for the backward, which normalises again (:mod:`.recompute`): as a
fused kernel does, not the centred input, the output and the statistics autograd would keep.
"""

from __future__ import annotations

from typing import Any

import autograd.numpy as anp
import numpy as np

from ..errors import UsageError
from .init import check_dtype, check_size
from .module import Module, check_input
from .recompute import recomputed

__all__ = ["LayerNorm", "RMSNorm"]


class LayerNorm(Module):
    """``(x − μ) / √(σ² + ε) · weight + bias`` over the last dim, of size ``normalized_shape``;
    ``weight`` starts at ones, ``bias`` at zeros (torch.nn.LayerNorm with one normalized dim)."""

    def __init__(self, normalized_shape: int, eps: float = 1e-5, dtype: Any = np.float32) -> None:
        dt = check_dtype("LayerNorm", dtype)
        self.normalized_shape = check_size("LayerNorm", "normalized_shape", normalized_shape, least=1)
        self.eps = float(eps)
        self.weight = np.ones(self.normalized_shape, dt)
        self.bias = np.zeros(self.normalized_shape, dt)

    def forward(self, x: Any) -> Any:
        check_input(self, x, self.normalized_shape)
        return recomputed(self._normalise, x, self.weight, self.bias)

    def _normalise(self, x: Any, weight: Any, bias: Any) -> Any:
        n = self.normalized_shape  # sum / n, not anp.mean, whose vjp turns float32 gradients float64
        mean = anp.sum(x, axis=-1, keepdims=True) / n
        centred = x - mean
        var = anp.sum(centred * centred, axis=-1, keepdims=True) / n
        return centred / anp.sqrt(var + self.eps) * weight + bias

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class RMSNorm(Module):
    """``x / √(mean(x²) + ε) · weight`` over the last dim of size ``normalized_shape``; ``weight``
    starts at ones (torch.nn.RMSNorm with one normalized dim, LLaMA's norm)."""

    def __init__(self, normalized_shape: int, eps: float = 1e-6, dtype: Any = np.float32) -> None:
        dt = check_dtype("RMSNorm", dtype)
        self.normalized_shape = check_size("RMSNorm", "normalized_shape", normalized_shape, least=1)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
            raise UsageError(f"RMSNorm: eps must be a number >= 0, got {eps!r}")
        self.eps = float(eps)
        self.weight = np.ones(self.normalized_shape, dt)

    def forward(self, x: Any) -> Any:
        check_input(self, x, self.normalized_shape)
        return recomputed(self._normalise, x, self.weight)

    def _normalise(self, x: Any, weight: Any) -> Any:
        ms = anp.sum(x * x, axis=-1, keepdims=True) / self.normalized_shape  # not anp.mean: float32 stays
        return x / anp.sqrt(ms + self.eps) * weight

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"
