"""A correct tree whose crossover forgets that the ring never wins at n = 2."""
import math
import numpy as np


def tree_all_reduce(dev, x):
    n, r = dev.size, dev.rank
    acc = np.array(x)
    p = 1 << (n.bit_length() - 1)
    if r >= p:
        dev.send(acc, r - p, tag=0)
        return dev.recv(r - p, tag=1)
    if r + p < n:
        acc = acc + dev.recv(r + p, tag=0)
    mask, step = 1, 2
    while mask < p:
        req = dev.isend(acc, r ^ mask, tag=step)
        acc = acc + dev.recv(r ^ mask, tag=step)
        req.wait()
        mask, step = mask << 1, step + 1
    if r + p < n:
        dev.send(acc, r + p, tag=1)
    return acc


def crossover_bytes(n, alpha, beta):
    steps = math.log2(n)
    return alpha * (2 * (n - 1) - steps) / (beta * (steps - 2 * (n - 1) / n))
