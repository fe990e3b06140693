"""All-reduces the hidden layer too: right values, twice the communication."""
import numpy as np


def mlp_forward(dev, x, w1, w2):
    t = len(dev.group("tp"))
    full = dev.all_reduce(np.maximum(x @ w1, 0.0).sum() * 0.0 + np.zeros((x.shape[0], x.shape[1])),
                          group="tp")
    return full + dev.all_reduce(np.maximum(x @ w1, 0.0) @ w2, group="tp")


def mlp_backward(dev, x, w1, w2, dy):
    a = x @ w1
    z = np.maximum(a, 0.0)
    da = (dy @ w2.T) * (a > 0)
    return dev.all_reduce(da @ w1.T, group="tp"), x.T @ da, z.T @ dy
