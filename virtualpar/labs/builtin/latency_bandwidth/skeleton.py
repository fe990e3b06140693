"""Lab: latency against bandwidth — a tree all-reduce, and where it stops beating the ring.

TASK 1
    Write ``tree_all_reduce(dev, x)``: every device returns the elementwise SUM of every device's ``x``
    (same shape and dtype), in O(log n) message steps instead of the ring's 2(n-1).  Recursive
    doubling: at step k each device exchanges its running sum with device ``rank XOR 2**k`` and adds.
    With n not a power of two, first fold the extra devices (rank >= p, p the largest power of two
    <= n) into devices rank - p, and hand them the result at the end.

TASK 2
    Write ``crossover_bytes(n, alpha, beta)``: the message size M (bytes) above which the ring beats
    recursive doubling, in the alpha-beta model (alpha: seconds per message, beta: seconds per byte),
    for n a power of two:
        ring:               2(n-1) * alpha + 2(n-1)/n * M * beta
        recursive doubling: log2(n) * (alpha + M * beta)
    Return math.inf when the ring never wins.

RULES
    Only ``dev.rank``, ``dev.size``, ``dev.send``, ``dev.recv``, ``dev.isend``, ``dev.irecv``; the
    collectives raise in this lab.

HOW IT IS CHECKED  (virtualpar lab check latency-bandwidth latency_bandwidth.py)
    - correct on 1 to 8 devices (powers of two and not), dtypes, shapes; safe in strict and
      shuffled modes;
    - latency: the busiest device sends at most 2*ceil(log2 n) messages, and on the modelled clock
      your tree beats virtualpar's ring on a small message;
    - crossover_bytes against the closed form on hidden (n, alpha, beta).
"""

import math

import numpy as np


def tree_all_reduce(dev, x):
    n, r = dev.size, dev.rank
    acc = np.array(x)
    p = 1 << (n.bit_length() - 1)  # the largest power of two <= n
    # TODO 1: devices r >= p send acc to r - p, then receive the final sum from it and return it.
    # TODO 2: devices r with r + p < n first add what r + p sends them.
    # TODO 3: for mask = 1, 2, 4, ... < p: exchange acc with r ^ mask (isend, recv, wait) and add.
    # TODO 4: devices r with r + p < n send the result to r + p.  Use a distinct tag per phase.
    raise NotImplementedError("write tree_all_reduce: see the TODOs above")


def crossover_bytes(n, alpha, beta):
    # TODO 5: solve ring time == recursive doubling time for M; math.inf if the ring never wins.
    raise NotImplementedError("write crossover_bytes")
