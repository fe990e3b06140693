"""Lab: Megatron's tensor-parallel MLP — column-parallel, then row-parallel, forward and backward.

The MLP is  y = relu(x @ W1) @ W2  with x of shape (batch, d), W1 (d, h), W2 (h, d).  Over the
mesh axis "tp" (size t), device i holds the COLUMNS i*h/t .. (i+1)*h/t of W1 (``w1``, shape
(d, h/t)) and the same ROWS of W2 (``w2``, shape (h/t, d)).  x is the same on every device of the
tp group (it may differ between data-parallel groups on a mesh with a "dp" axis).

TASK 1
    ``mlp_forward(dev, x, w1, w2)`` returns y (batch, d) on every device.  Each device computes its
    slice of the hidden layer without talking to anyone; one all-reduce over tp sums the partial
    products (Megatron's "g"; its "f" before the layer is the identity in the forward).

TASK 2
    ``mlp_backward(dev, x, w1, w2, dy)`` returns ``(dx, dw1, dw2)``: dx (batch, d) the full input
    gradient on every device, dw1 and dw2 the gradients of THIS device's shards.  "g" backward is
    the identity, "f" backward is an all-reduce.

RULES
    The only communication allowed is ``dev.all_reduce(..., group="tp")``: one in the forward, one in
    the backward.  Everything else (send, recv, all_gather, ...) raises in this lab.

HOW IT IS CHECKED  (virtualpar lab check megatron-mlp megatron_mlp.py)
    against numpy on tp = 1, 2, 4 and on a dp=2 x tp=2 mesh; exactly one all-reduce of (batch, d)
    per pass.
"""

import numpy as np


def mlp_forward(dev, x, w1, w2):
    # TODO 1: the local hidden slice relu(x @ w1), its partial product with w2, then the all-reduce over "tp"
    raise NotImplementedError("write mlp_forward")


def mlp_backward(dev, x, w1, w2, dy):
    # TODO 2: recompute a = x @ w1 and z = relu(a); dw2 = z.T @ dy; da = (dy @ w2.T) * (a > 0);
    #         dw1 = x.T @ da; dx = the all-reduce over "tp" of da @ w1.T
    raise NotImplementedError("write mlp_backward")
