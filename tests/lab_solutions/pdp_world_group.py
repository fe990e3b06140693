"""Reference solution of the pipeline x data-parallel lab (kept out of the skeleton)."""

import numpy as np


def pipeline_dp_step(dev, x, y, w, microbatches, global_batch):
    stage = dev.index.pp
    first, last = dev.group("pp")  # the ranks of stage 0 and stage 1 in my pipeline
    xs, ys = np.array_split(x, microbatches), np.array_split(y, microbatches)
    grad = np.zeros_like(w)
    saved = []
    for m in range(microbatches):  # GPipe: every forward ...
        if stage == 0:
            h = np.tanh(xs[m] @ w)
            dev.send(h, last, tag=m)
            saved.append(h)
        else:
            h = dev.recv(first, tag=m)
            saved.append((h, h @ w))
    for m in range(microbatches):  # ... then every backward
        if stage == 1:
            h, out = saved[m]
            dout = (out - ys[m]) / global_batch
            grad += h.T @ dout
            dev.send(dout @ w.T, first, tag=100 + m)
        else:
            dh = dev.recv(last, tag=100 + m)
            grad += xs[m].T @ (dh * (1 - saved[m] ** 2))
    return dev.all_reduce(grad, group=None)
