"""Timeline parallelism for recurrent models: ``SequencePipe``.

A recurrent model's sequence is split along time across the devices of one mesh axis.  Device i
runs time segment i of every microbatch, starting from the recurrent state device i−1 hands it,
and hands its final state to device i+1; the gradient of that state flows back the same way.
Microbatches are pipelined, so while device 1 runs segment 1 of microbatch 0, device 0 runs
segment 0 of microbatch 1.  This is a pipeline whose stages are *time segments* that share one
set of weights: it runs on the pipeline executor with the 1F1B schedule, each device holding a
full copy of the weights, and the weight gradients of the segments are summed over the axis
before one optimizer step (so every copy stays identical and equal to one device's training).

The user subclasses ``SequencePipe`` and writes only the model's pieces::

    forward(inputs, states) -> (outputs, states)      # tuples of arrays, batch first
    loss_fn(outputs, labels) -> scalar                 # read on the last segment's outputs
    get_init_states() -> tuple of arrays               # per sample, broadcast over the batch
    get_group() -> mesh axis name

with ``virtualpar.nn`` layers and no backward code.  The loss is computed on the last time
segment (it reads the labels at the last step): ``loss_fn`` gets that
segment's outputs only, so a loss that reads earlier steps differs from :func:`reference_step`,
which gives it the whole sequence.  With M microbatches the step's
loss and gradients are the mean over the microbatches (see :func:`reference_step`).

Makespan under unit costs (each segment's forward 1, backward b, free links), D devices, M
microbatches, 1F1B: every device does M forwards and M backwards and the schedule is the
pipeline's, so makespan = (M + D − 1)(1 + b) — 2(M + D − 1) for b = 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import nn
from ..errors import UsageError

__all__ = ["SequencePipe", "reference_step"]


class SequencePipe(nn.Module):
    """Base class of a model run with timeline parallelism (see the module docstring)."""

    def forward(self, inputs: tuple, states: tuple) -> tuple[tuple, tuple]:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must define forward(inputs, states)")

    def loss_fn(self, inputs: tuple, labels: tuple) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must define loss_fn(outputs, labels)")

    def get_init_states(self) -> tuple:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must define get_init_states()")

    def get_group(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must define get_group()")

    def initial_states(self, batch: int) -> tuple:
        """``get_init_states()`` broadcast to ``batch`` samples (a leading batch dim)."""
        states = self.get_init_states()
        if not isinstance(states, tuple):
            raise UsageError(f"{type(self).__name__}.get_init_states() must return a tuple of arrays, got "
                             f"{type(states).__name__}")
        return tuple(np.broadcast_to(s, (batch, *np.shape(s))).copy() for s in states)


def reference_step(model: SequencePipe, inputs: tuple, labels: tuple,
                   microbatches: int = 1) -> tuple[float, dict[str, np.ndarray]]:
    """The whole sequence on one device: ``(loss, grads)`` — what the time-split run must equal
    when ``loss_fn`` reads only the last time segment (``loss_fn`` gets every step's outputs here).

    With ``microbatches`` M, the batch is split into M equal parts along dim 0, as
    ``TimelineParallel(microbatches=M)`` splits it, and the loss and gradients are the mean over
    the parts — the gradient-accumulation convention of ``nn.reference_train``.  That equals the
    whole batch's loss when each part's loss is a mean over the same number of rows; a masked loss
    gives each part the same weight whatever rows its mask keeps, so there it differs."""
    if microbatches != 1:
        parts = [reference_step(model, xs, ys) for xs, ys in zip(
            zip(*(nn.split_microbatches(a, microbatches) for a in inputs)),
            zip(*(nn.split_microbatches(a, microbatches) for a in labels)))]
        return float(np.mean([p[0] for p in parts])), nn.accumulate([p[1] for p in parts], "mean")
    batch = np.shape(inputs[0])[0]

    def loss(m: SequencePipe, *xs: Any) -> Any:
        outputs, _ = m(tuple(xs), m.initial_states(batch))
        return m.loss_fn(outputs, labels)

    return nn.value_and_grad(loss, model, *inputs)
