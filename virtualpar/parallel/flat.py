"""A unit's parameters out of its flat vector (:mod:`.layout`), as one autograd primitive.

Slicing each parameter out of a traced flat vector made autograd scatter every gradient into the
whole vector with ``np.add.at`` (one per parameter: 0.87 s of a step once); :func:`split_flat`
cuts them all at once and its backward concatenates their gradients in one pass.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from autograd.extend import defvjp, primitive

__all__ = ["split_flat", "unit_params"]


@primitive
def split_flat(flat: np.ndarray, pieces: tuple[tuple[int, int, tuple[int, ...]], ...]) -> tuple:
    """The parameters ``flat[a:b].reshape(shape)`` for each (a, b, shape) of ``pieces``, as views.
    Its backward concatenates their gradients (zeros over the padding): one pass over the unit,
    where slicing each parameter out of a traced vector made autograd scatter every gradient into
    the whole vector with ``np.add.at``."""
    return tuple(flat[a:b].reshape(shape) for a, b, shape in pieces)


def _split_back(ans: tuple, flat: np.ndarray, pieces: tuple) -> Callable[[tuple], np.ndarray]:
    def vjp(g: tuple) -> np.ndarray:
        parts = [np.ravel(gi) for gi in g]
        pad = flat.size - pieces[-1][1] if pieces else flat.size
        if pad:
            parts.append(np.zeros(pad, flat.dtype))
        return np.concatenate(parts).astype(flat.dtype, copy=False)
    return vjp


defvjp(split_flat, _split_back)


def unit_params(unit: Any, flat: Any) -> dict[str, Any]:
    """The unit's named parameters as views of its (local, or gathered) flat vector."""
    offsets = unit.offsets()
    params = split_flat(flat, tuple((a, b, tuple(shape)) for _, a, b, shape in offsets))
    return {n: params[i] for i, (n, _, _, _) in enumerate(offsets)}
