"""The single-process reference every distributed run is compared against."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..errors import UsageError
from .functional import value_and_grad
from .module import Module
from .optim import Optimizer, accumulate

__all__ = ["reference_train", "split_microbatches"]


def split_microbatches(x: np.ndarray, microbatches: int) -> list[np.ndarray]:
    """``x`` split into ``microbatches`` equal parts along dim 0 (an uneven split is an error)."""
    n = np.shape(x)[0]
    if microbatches < 1 or n % microbatches:
        raise UsageError(f"a batch of {n} rows does not split into {microbatches} equal microbatches")
    return np.split(np.asarray(x), microbatches)


def reference_train(model: Module, batches: Sequence[tuple[Any, Any]], loss: Callable[[Any, Any], Any],
                    optimizer: Optimizer, steps: int,
                    microbatches: int = 1) -> tuple[list[float], dict[str, np.ndarray]]:
    """Train ``model`` in this process for ``steps`` steps, cycling through ``batches`` of (x, y).

    Each batch is split into ``microbatches`` equal parts along dim 0; the gradient of each is
    taken and the **mean** over microbatches is applied in one optimizer step per batch (equal
    to the full batch's gradient of a mean loss).  The step's loss is the mean of the microbatch
    losses.  A model with dropout (``GPT(dropout=p)``) is called ``model(x, step=k, rows=...)``:
    step k's masks, at the microbatch's rows of the batch, as ``ParallelTrainer`` draws them.
    Returns ``(losses per step, final state_dict)``; ``model`` ends trained.
    """
    if not isinstance(batches, (list, tuple)) or not batches:
        raise UsageError("reference_train: batches must be a non-empty list of (x, y) pairs, got "
                         f"{type(batches).__name__}")
    # (x, y), not [(x, y)]
    if isinstance(batches, tuple) and len(batches) == 2 and hasattr(batches[0], "shape"):
        raise UsageError("reference_train: batches is a list of (x, y) pairs: pass [(x, y)] "
                         "for one batch, not (x, y)")
    if not all(isinstance(b, (list, tuple)) and len(b) == 2 for b in batches):
        raise UsageError("reference_train: every batch must be an (x, y) pair")
    losses = []
    drops = bool(getattr(model, "dropout", 0.0))
    for step in range(steps):
        x, y = batches[step % len(batches)]
        grads, values = [], []
        rows = np.shape(x)[0] // microbatches if microbatches >= 1 else 0
        pairs = zip(split_microbatches(x, microbatches), split_microbatches(y, microbatches))
        for i, (xm, ym) in enumerate(pairs):
            kw = {"step": step, "rows": (i * rows, np.shape(x)[0])} if drops else {}
            value, g = value_and_grad(lambda m, a, b: loss(m(a, **kw), b), model, xm, ym)
            values.append(value)
            grads.append(g)
        model.load_state_dict(optimizer.step(model.parameters(), accumulate(grads, "mean")))
        losses.append(float(np.mean(values)))
    return losses, model.state_dict()
