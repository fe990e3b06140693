"""Reference solution of the latency-against-bandwidth lab (kept out of the skeleton)."""

import math

import numpy as np


def tree_all_reduce(dev, x):
    """Recursive doubling; with n not a power of two the extra devices fold into the first ones."""
    n, r = dev.size, dev.rank
    acc = np.array(x)
    p = 1 << (n.bit_length() - 1)  # the largest power of two <= n
    if r >= p:  # an extra device: hand x to its partner, get the sum back at the end
        dev.send(acc, r - p, tag=0)
        return dev.recv(r - p, tag=1)
    if r + p < n:
        acc = acc + dev.recv(r + p, tag=0)
    mask, step = 1, 2
    while mask < p:
        peer = r ^ mask
        request = dev.isend(acc, peer, tag=step)
        acc = acc + dev.recv(peer, tag=step)
        request.wait()
        mask, step = mask << 1, step + 1
    if r + p < n:
        dev.send(acc, r + p, tag=1)
    return acc


def crossover_bytes(n, alpha, beta):
    steps = math.log2(n)
    slope = steps - 2 * (n - 1) / n  # per byte, recursive doubling minus ring
    if slope <= 0:
        return math.inf
    return alpha * (2 * (n - 1) - steps) / (beta * slope)
