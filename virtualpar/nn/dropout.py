"""DropoutMasks whose masks every sharding draws alike: a counter-based hash of the global position.

A mask element is kept when ``splitmix64(key ⊕ i) ≥ p·2⁶⁴``, with ``i`` the element's index in the
whole tensor (row-major over its global shape) and ``key`` a hash of (seed, training step, layer,
site).  The mask is a pure function of where the element is, never of which device computes it or
in what order, so a tensor-, sequence-, context- or data-parallel run drops exactly the elements
one process drops: training with dropout stays exact over any mesh (the aim of JAX's counter-based
keys and of Megatron-LM's per-region RNG trackers).  Kept elements are scaled by 1/(1 − p)::

    y = where(mask, x / (1 − p), 0)

Cost: ~12 integer operations per element to draw, and the mask — one byte per element — kept for
the backward (Korthikanti et al. 2022 count it: the s·b·h bytes of each hidden dropout, a·s²·b of
the attention's).  A model draws masks only when it is given the training step
(``model(tokens, step=k)``); without one it runs as torch's ``eval()``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import autograd.numpy as anp
import numpy as np

from ..errors import UsageError

__all__ = ["DropoutMasks", "dropout", "layer_key", "keep_mask", "check_rate"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (Steele et al. 2014) of ``z + golden``, elementwise on uint64 arrays."""
    z = z + _GOLDEN
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def layer_key(seed: int, step: int, layer: int, site: int = 0) -> int:
    """The key of one layer's masks at one site in one training step: every word mixed in turn."""
    z = np.zeros(1, np.uint64)
    for word in (seed, step, layer, site):
        z = _mix(z ^ np.uint64(int(word) % 2**64))
    return int(z[0])


def check_rate(where: str, p: Any) -> float:
    """A dropout probability: a number in [0, 1)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
        raise UsageError(f"{where}: dropout must be a probability in [0, 1), got {p!r}")
    return float(p)


def keep_mask(key: int, p: float, full: tuple[int, ...], starts: tuple[int, ...],
              shape: tuple[int, ...]) -> np.ndarray:
    """The kept elements (True) of the block ``shape`` at global offsets ``starts`` of a tensor of
    global shape ``full``; ``key`` already holds the site."""
    index = np.zeros((1,) * len(shape), np.uint64)
    for d, (n, start, size) in enumerate(zip(shape, starts, full)):
        axis = np.arange(start, start + n, dtype=np.uint64)
        index = index * np.uint64(size) + axis.reshape([-1 if i == d else 1 for i in range(len(shape))])
    threshold = np.uint64(min(int(p * 2.0**64), 2**64 - 1))
    return _mix(index ^ np.uint64(key)) >= threshold


def dropout(x: Any, mask: np.ndarray, p: float) -> Any:
    """``where(mask, x / (1 − p), 0)``; the backward keeps only ``mask``."""
    return anp.where(mask, x * (1.0 / (1.0 - p)), 0.0)


@dataclass(frozen=True)
class DropoutMasks:
    """Where one block's masks come from on this device: rate ``p``, the layer's ``key``, and the
    global coordinates of this device's piece — rows ``row0`` … of ``rows``, hidden positions
    ``pos0`` …, attention queries ``q0`` … of the sequence ``seq``, heads ``head0`` … of ``heads``,
    features of ``width``.  The three sites are Megatron's: the attention probabilities, the
    attention's output and the MLP's output (both before their residual add)."""

    p: float
    key: int
    rows: int
    seq: int
    heads: int
    width: int
    row0: int = 0
    pos0: int = 0
    q0: int = 0
    head0: int = 0

    def at(self, **offsets: int) -> "DropoutMasks":
        return replace(self, **offsets)

    def attention(self, shape: tuple[int, ...], k0: int = 0) -> np.ndarray:
        """The mask of attention probabilities (batch, heads, queries, keys) whose first key is ``k0``."""
        return keep_mask(layer_key(self.key, 0, 0, 1), self.p, (self.rows, self.heads, self.seq, self.seq),
                         (self.row0, self.head0, self.q0, k0), shape)

    def hidden(self, site: int, shape: tuple[int, ...]) -> np.ndarray:
        """The mask of a hidden state (batch, seq, width) at ``site`` 2 (attention out) or 3 (MLP out)."""
        return keep_mask(layer_key(self.key, 0, 0, site), self.p, (self.rows, self.seq, self.width),
                         (self.row0, self.pos0, 0), shape)
