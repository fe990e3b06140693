"""Ring attention over the context-parallel axis (Liu et al. 2023; Megatron-LM's context parallelism).

cp rank r holds the queries, keys and values of sequence chunk r (S/cp positions from r·S/cp).
Its K and V travel around the ring: at step t rank r holds chunk (r − t) mod cp, folds it into an
online-softmax state (:func:`virtualpar.nn.attention_block_update`) and passes it to rank r + 1.
After cp − 1 shifts every query has seen every key, and no device ever holds more than one
chunk's scores (s/cp × s/cp per head).  With causal attention a chunk wholly in the queries'
future contributes exactly nothing (every score masked, erased by the online softmax's rescaling)
but is still computed: a skipped chunk would leave its shift out of the backward's graph on some
ranks, and the backward's ring would wait for them forever.  So every rank does 4·(S/cp)·S·hd
FLOPs per head forward, the masked half included, as ``flops_per_token`` counts attention.

The shift is an autograd primitive whose vjp is the shift the other way round, so the backward —
gradients of K and V travelling back to their owners — follows from the forward.  Cost per shift:
each rank sends and receives one chunk of K (and one of V): b·h·(S/cp)·hd elements.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from autograd.extend import defvjp, primitive

from .. import nn

__all__ = ["ring_attention", "ring_shift"]

FORWARD_TAG = 1 << 24  # far above the pipeline executor's tags (1 + 4·(stage·M + m) + kind)
BACKWARD_TAG = FORWARD_TAG + 1


def _neighbours(dev: Any) -> tuple[int, int]:
    ring = dev.group("cp")
    r = dev.group_rank("cp")
    return ring[(r + 1) % len(ring)], ring[(r - 1) % len(ring)]


@primitive
def ring_shift(x: np.ndarray, dev: Any) -> np.ndarray:
    """Send ``x`` to the next cp rank, return the previous rank's."""
    nxt, prev = _neighbours(dev)
    return dev.sendrecv(np.ascontiguousarray(x), dst=nxt, src=prev, sendtag=FORWARD_TAG)


def _shift_back(ans: np.ndarray, x: np.ndarray, dev: Any):
    def vjp(dy: np.ndarray) -> np.ndarray:
        nxt, prev = _neighbours(dev)
        return dev.sendrecv(np.ascontiguousarray(dy), dst=prev, src=nxt, sendtag=BACKWARD_TAG)
    return vjp


defvjp(ring_shift, _shift_back)


def ring_attention(dev: Any, q: Any, k: Any, v: Any, causal: bool, drop: Any = None) -> Any:
    """Attention of this rank's queries over every rank's keys; q, k, v (b, heads, S/cp, hd).
    ``drop``: the layer's dropout (an ``nn.DropoutMasks``), whose mask of each key chunk is drawn at that
    chunk's global positions."""
    cp = len(dev.group("cp"))
    r = dev.group_rank("cp")
    chunk = np.shape(q)[2]
    q_start = r * chunk
    state = nn.attention_init(q)
    for t in range(cp):
        k_start = ((r - t) % cp) * chunk
        keep = None if drop is None else drop.attention(np.shape(q)[:3] + np.shape(k)[2:3], k_start)
        state = nn.attention_block_update(state, q, k, v, causal, q_start, k_start, keep,
                                          drop.p if drop is not None else 0.0)
        if t < cp - 1:
            k, v = ring_shift(k, dev), ring_shift(v, dev)
    return nn.attention_finish(state)
