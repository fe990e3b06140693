"""Reference solution of the ring all-reduce lab (kept out of the skeleton)."""

import numpy as np


def ring_all_reduce(dev, x):
    n, r = dev.size, dev.rank
    flat = np.array(x).reshape(-1)  # a contiguous copy: chunks are views into it
    if n == 1:
        return flat.reshape(np.shape(x))
    chunks = np.array_split(flat, n)
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):  # reduce-scatter: after it, device r holds the sum of chunk r+1
        out, into = (r - step) % n, (r - step - 1) % n
        request = dev.isend(chunks[out].copy(), right, tag=step)
        chunks[into] += dev.recv(left, tag=step)
        request.wait()
    for step in range(n - 1):  # all-gather: pass the finished chunks around the ring
        out, into = (r + 1 - step) % n, (r - step) % n
        request = dev.isend(chunks[out].copy(), right, tag=n + step)
        chunks[into][...] = dev.recv(left, tag=n + step)
        request.wait()
    return flat.reshape(np.shape(x))
