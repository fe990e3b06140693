"""Modelled time of the pairwise exchange (``collectives/direct.py``'s all_to_all) without running it.

In step k = 1 … n−1 member p sends its piece for p + k to p + k and receives from p − k
(``sendrecv``), so it leaves the step at ``max(t_p + c_k[p], t_{p−k} + c_k[p−k])`` with
``c_k[p] = α(p→p+k) + |piece_{p+k}|/β(p→p+k)``: a max-plus map like the ring's, with offset k
at step k (``max_plus.max_plus_column``).  The shared-memory all_to_all, which moves no
messages, is charged this way — exactly what the exchange would cost on links idle at entry.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from virtualpar.mesh.topology import Topology
from virtualpar.sim.max_plus import max_plus_column

__all__ = ["pairwise_exchange_column"]


def pairwise_exchange_column(topology: Topology, ranks: Sequence[int], piece_nbytes: Sequence[int],
                             member: int) -> list[float]:
    """Column ``member`` of the exchange's max-plus matrix (``D[q][member]`` for every q), in
    O(n²): ``piece_nbytes[c]`` is the size of every member's piece for member c (all members' arrays
    have one shape).  On a uniform topology with equal pieces every entry is (n−1)(α + P/β)."""
    n = len(ranks)
    if len(piece_nbytes) != n:
        raise ValueError(f"pairwise_exchange_column: {n} ranks need {n} piece sizes; got {len(piece_nbytes)}")
    rk = np.asarray(ranks)
    sizes = np.asarray(piece_nbytes, dtype=np.float64)

    def steps(lo: int, hi: int) -> np.ndarray:  # rows lo..hi−1: steps k = lo+1 .. hi, one lookup for all
        to = (np.arange(n) + np.arange(lo + 1, hi + 1)[:, None]) % n  # step k: p -> p+k, with its piece
        latency, bandwidth = topology.figures_many(np.broadcast_to(rk, to.shape).ravel(), rk[to].ravel())
        size = sizes[to]
        with np.errstate(divide="ignore", invalid="ignore"):
            return latency.reshape(to.shape) + np.where(size > 0, size / bandwidth.reshape(to.shape), 0.0)

    return max_plus_column(steps, list(range(1, n)), member, n)
