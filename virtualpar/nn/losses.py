"""Losses: scalar means, differentiable with autograd.

``mse_loss(pred, target) = mean((pred − target)²)`` over every element.
``cross_entropy(logits, labels, mask=None) = −mean_{i: mask_i} log softmax(logits_i)[labels_i]``
over the rows (all leading dims of ``logits`` flattened), with a log-sum-exp shifted by the row
max for stability.  A mask that selects no row gives 0 (and zero gradients), as the timeline
reference loss does for a microbatch without labelled rows.
"""

from __future__ import annotations

from typing import Any

import autograd.numpy as anp
import numpy as np
from autograd.extend import defvjp, notrace_primitive, primitive

from ..errors import UsageError
from .lookup import pick

__all__ = ["mse_loss", "cross_entropy"]


def mse_loss(pred: Any, target: Any) -> Any:
    """``mean((pred − target)²)`` over every element; shapes must match (no broadcasting).  Gradient
    ``2(pred − target)/N`` (torch.nn.functional.mse_loss)."""
    if np.shape(pred) != np.shape(target):
        raise UsageError(f"mse_loss: pred has shape {np.shape(pred)}, target {np.shape(target)}")
    return _mse(pred, target)


@primitive
def _mse(pred: np.ndarray, target: np.ndarray) -> Any:
    """``Σ(pred − target)² / N`` as one autograd primitive, backward ``±(2·dy/N)(pred − target)``:
    one node instead of four (subtract, square, sum, divide, whose vjps broadcast the scalar back
    through ``repeat``), in the dtype of the inputs (``anp.mean``'s vjp would give float64)."""
    diff = pred - target
    return np.sum(diff * diff) / max(int(np.size(diff)), 1)


def _mse_grad(sign: float):
    def make(ans: Any, pred: np.ndarray, target: np.ndarray):
        def vjp(g: Any) -> np.ndarray:
            diff = np.subtract(pred, target)
            diff *= np.asarray(sign * 2.0 * g / max(int(np.size(diff)), 1), dtype=diff.dtype)
            return diff
        return vjp
    return make


defvjp(_mse, _mse_grad(1.0), _mse_grad(-1.0))


@notrace_primitive
def _row_max(x: np.ndarray) -> np.ndarray:
    """``max`` over the last dim, kept; autograd passes the plain values and records nothing."""
    return np.max(x, axis=-1, keepdims=True)


def cross_entropy(logits: Any, labels: Any, mask: Any = None) -> Any:
    """Mean over the unmasked rows of −log softmax(logits)[label]; a masked row's label is never
    read, so it may be any placeholder (torch's ignore_index −100)."""
    labels = np.asarray(labels)
    shape = np.shape(logits)
    if len(shape) == 0:
        raise UsageError("cross_entropy: logits must have a class dimension, got a scalar")
    if labels.dtype.kind not in "iu":
        raise UsageError(f"cross_entropy: labels must be integers, got dtype {labels.dtype}")
    if tuple(labels.shape) != tuple(shape[:-1]):
        raise UsageError(f"cross_entropy: logits of shape {shape} need labels of shape {shape[:-1]}, got "
                         f"{labels.shape}")
    classes = shape[-1]
    rows = labels.reshape(-1)
    if mask is None:
        keep = np.ones(rows.shape, bool)
    else:
        keep = np.asarray(mask)
        if keep.dtype != np.bool_ or keep.shape != labels.shape:  # 0.2 is not a yes; (3, 2) is not (2, 3)
            raise UsageError(f"cross_entropy: mask must be a bool array of the labels' shape "
                             f"{labels.shape}, got {keep.dtype} of shape {keep.shape}")
        keep = keep.reshape(-1)
    used = rows[keep]  # a masked row's label is never read: any placeholder will do (torch's -100)
    if used.size and (used.min() < 0 or used.max() >= classes):
        raise UsageError(f"cross_entropy: labels must lie in 0..{classes - 1}, got "
                         f"{used.min()}..{used.max()}")
    count = int(keep.sum())
    if count == 0:
        return anp.sum(logits) * 0.0
    # without a mask the logits are used as they are: a reshape or a row selection would keep them
    if mask is None:
        picked = logits
    else:
        picked, labels = anp.reshape(logits, (-1, classes))[keep], rows[keep]
    shift = _row_max(picked)  # a constant to autograd: log-softmax does not depend on the shift
    z = picked - shift
    logsumexp = anp.log(anp.sum(anp.exp(z), axis=-1))
    chosen = pick(z, labels)  # keeps the labels for the backward, not the logits
    return anp.sum(logsumexp - chosen) / count
