"""Gathers the weight shards and computes the whole MLP on every device: correct, but against the rules."""
import numpy as np


def mlp_forward(dev, x, w1, w2):
    w1 = dev.all_gather(w1, dim=1, group="tp")
    w2 = dev.all_gather(w2, dim=0, group="tp")
    return np.maximum(x @ w1, 0.0) @ w2


def mlp_backward(dev, x, w1, w2, dy):
    raise NotImplementedError
