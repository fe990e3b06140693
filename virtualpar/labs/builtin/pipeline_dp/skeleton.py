"""Lab: one training step of a 2-stage pipelined MLP with a data-parallel axis, by hand.

The mesh is {"dp": 2, "pp": 2}.  The model is  out = tanh(x @ W0) @ W1  with the loss
0.5 * sum((out - y)**2) / global_batch over the WHOLE batch (both data-parallel replicas).
Stage 0 (``dev.index.pp == 0``) holds W0, stage 1 holds W1.  Each data-parallel replica
(``dev.index.dp``) has its own ``x`` (B, d) and ``y`` (B, o).

TASK
    Write ``pipeline_dp_step(dev, x, y, w, microbatches, global_batch)`` returning the gradient of
    THIS device's weight ``w`` (W0 on stage 0, W1 on stage 1), summed over the microbatches and
    over the data-parallel replicas:
      - split x and y into ``microbatches`` parts (np.array_split);
      - GPipe order: every forward, then every backward;
      - stage 0 sends h = tanh(x_m @ W0) to stage 1; stage 1 computes out = h @ W1, its dW1, and
        sends dh = dout @ W1.T back; stage 0 finishes dW0 with dh * (1 - h**2);
      - finally sum the gradients over the "dp" axis.
    ``dev.group("pp")`` gives the ranks (stage 0, stage 1) of your pipeline.

RULES
    Point-to-point (send, recv, isend, irecv) between the stages, and ``dev.all_reduce`` over
    "dp"; the other collectives raise.

HOW IT IS CHECKED  (virtualpar lab check pipeline-dp pipeline_dp.py)
    The gradients against numpy over the whole batch, for 1, 2 and 4 microbatches; strict mode;
    the bytes between stages are the activations and their gradients only.
"""

import numpy as np


def pipeline_dp_step(dev, x, y, w, microbatches, global_batch):
    stage = dev.index.pp
    first, last = dev.group("pp")
    xs, ys = np.array_split(x, microbatches), np.array_split(y, microbatches)
    grad = np.zeros_like(w)
    # TODO 1: forwards of every microbatch (stage 0 sends tanh(x_m @ w); stage 1 receives, keeps h and h @ w)
    # TODO 2: backwards in the same order (stage 1: dout = (out - y_m) / global_batch, dW1 += h.T @ dout,
    #         send dout @ w.T; stage 0: receive dh, dW0 += x_m.T @ (dh * (1 - h**2)))
    # TODO 3: sum grad over the "dp" axis and return it.  Hint: a distinct tag per microbatch and direction.
    raise NotImplementedError("write pipeline_dp_step: see the TODOs above")
