"""Lab: a ring all-reduce, built from send and receive.

TASK
    Write ``ring_all_reduce(dev, x)``.  Every device calls it with its own numpy array ``x`` (same shape
    and dtype on every device).  Each must return the elementwise SUM of every device's ``x``, with
    ``x``'s shape and dtype.  Do it as a ring: a reduce-scatter (n-1 steps: pass a chunk to the right,
    add the chunk that arrives from the left), then an all-gather (n-1 steps: pass the finished
    chunks around).  See LAB.md for the picture.

RULES
    Use only ``dev.rank``, ``dev.size``, ``dev.send``, ``dev.recv``, ``dev.isend`` and ``dev.irecv``
    (``isend``/``irecv`` return a request: call ``request.wait()``).  The collectives
    (``dev.all_reduce``, ``dev.all_gather``, ...) raise in this lab.

HOW IT IS CHECKED  (virtualpar lab check ring-allreduce ring_allreduce.py)
    - correct on 1 to 5 devices, for sizes that divide and that don't, with fewer elements than
      devices, for float64, float32 and int64, and for non-contiguous inputs;
    - safe in strict mode (a send completes only once its receive is posted: a ring where every
      device sends before it receives waits forever) and with shuffled message timing;
    - cost: the busiest device may send at most about 2(n-1)/n * M bytes (M = the bytes of x).
"""

import numpy as np


def ring_all_reduce(dev, x):
    n, r = dev.size, dev.rank
    flat = np.array(x).reshape(-1)  # your own contiguous copy of x
    chunks = np.array_split(flat, n)  # n views into flat; sizes may differ by one (or be empty)
    right, left = (r + 1) % n, (r - 1) % n
    # TODO 1: reduce-scatter. For step in range(n - 1): send chunk (r - step) % n to the right and add
    #         what arrives from the left into chunk (r - step - 1) % n.
    #         Hint: start the send with dev.isend(...), receive with dev.recv(...), then wait on the send,
    #         so that no device blocks in a send while its neighbour blocks in one too.
    # TODO 2: all-gather. For step in range(n - 1): send chunk (r + 1 - step) % n to the right and store
    #         what arrives from the left in chunk (r - step) % n.
    # Hint: give each step its own tag, so a fast neighbour's next message is never taken for this one.
    raise NotImplementedError("write ring_all_reduce: see the TODOs above")
