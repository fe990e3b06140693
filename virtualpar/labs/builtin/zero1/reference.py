"""Reference solution of the ZeRO-1 lab (kept out of the skeleton)."""

import numpy as np


def zero1_step(dev, params, grad, state, lr=1e-2, betas=(0.9, 0.999), eps=1e-8):
    n, r = dev.size, dev.rank
    g = dev.reduce_scatter(grad, op="sum") / n  # my shard of the mean gradient
    lo = r * (params.size // n)
    p = params[lo:lo + g.size]
    if not state:
        state.update(m=np.zeros_like(g), v=np.zeros_like(g), t=0)
    state["t"] += 1
    b1, b2 = betas
    state["m"] = b1 * state["m"] + (1 - b1) * g
    state["v"] = b2 * state["v"] + (1 - b2) * g * g
    m_hat = state["m"] / (1 - b1 ** state["t"])
    v_hat = state["v"] / (1 - b2 ** state["t"])
    return dev.all_gather(p - lr * m_hat / (np.sqrt(v_hat) + eps))
