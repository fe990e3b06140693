"""Max-plus columns: the delays from every member's entry clock to one member's exit, for schedules
of shifting steps (see ``sim/schedules.py`` for why a schedule is a max-plus linear map).

A step k maps the members' clocks as ``t'_p = max(t_p + c_k[p], t_{p−o_k} + c_k[p−o_k])``; member
``me``'s column is its unit vector taken back through the steps from the last (O(K·n) for K
steps of n members).  The ring's steps (:class:`RingSteps`) all shift by one, and on a ring whose
links have one latency and one bandwidth, moving chunks of one size, every step adds the same
time c to every member: then every entry of the column is c added K times (after n − 1 steps back
every member has a chain to ``me``), which :func:`ring_column` returns in O(K + n) — the same
floats as the general walk, which at 256 members cost a device ~1.7 ms of CPU in its first
512 KiB all_reduce (2 × 255 steps of three numpy operations).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from virtualpar.mesh.topology import Topology

__all__ = ["NEVER", "RingLinks", "RingSteps", "max_plus_column", "ring_column"]

NEVER = float("-inf")  # max-plus zero: no chain of steps leads from one clock to the other


def ring_column(steps: "RingSteps", member: int) -> list[float]:
    """Column ``member`` of the ring schedule ``steps`` (every step shifts by one): K additions of
    one time when the ring is uniform (see the module docstring), else :func:`max_plus_column`."""
    n, c = steps.members, steps.uniform()
    if c is not None:
        total = 0.0
        for _ in range(steps.count):  # in the order the walk adds them: the same rounding
            total = c + total
        return [total] * n
    return max_plus_column(steps, [1] * steps.count, member, n)


def max_plus_column(steps: Callable[[int, int], np.ndarray], offsets: Sequence[int], member: int,
                    n: int) -> list[float]:
    """Row ``member`` of ``A_K ⊗ … ⊗ A_1`` where step k's matrix maps ``t'_p = max(t_p + c_k[p],
    t_{p−o_k} + c_k[p−o_k])`` (member p's own message keeps it busy c_k[p]; the one from
    p − o_k arrives after c_k[p − o_k]).  Backwards from the last step: ``u'[q] = c_k[q] +
    max(u[q], u[q + o_k])``; numpy over the members (a 64-member ring: 126 steps in ~0.5 ms).
    ``steps(lo, hi)`` gives rows lo..hi−1 of c; they are asked for ``_STEP_BLOCK`` at a time."""
    u = np.full(n, NEVER)
    u[member] = 0.0
    members = np.arange(n)
    shifted = {off: (members + off) % n for off in set(offsets)}
    for hi in range(len(offsets), 0, -_STEP_BLOCK):
        lo = max(hi - _STEP_BLOCK, 0)
        block = steps(lo, hi)
        for k in range(hi - 1, lo - 1, -1):
            u = block[k - lo] + np.maximum(u, u[shifted[offsets[k]]])
    return u.tolist()


_STEP_BLOCK = 32  # rows of step times built at once: 64 KiB at 256 members, reused from the heap


class RingLinks:
    """The route figures of a ring's hops p -> p+1 over ``ranks`` (``latency``, ``bandwidth``: one
    entry per member), and ``same``: their one (latency, bandwidth) when every hop has the same,
    else None.  They depend on the group alone, so a clock keeps them per group: a column for a new
    size then looks up no routes (at 16 devices a new size's column cost ~90 µs of CPU, most of it
    this lookup and the uniformity test)."""

    __slots__ = ("latency", "bandwidth", "same")

    def __init__(self, topology: Topology, ranks: Sequence[int]) -> None:
        ranks = list(ranks)
        self.latency, self.bandwidth = topology.figures_many(ranks, ranks[1:] + ranks[:1])  # p -> p+1
        lat, bw = self.latency, self.bandwidth
        uniform = len(ranks) and float(lat.min()) == float(lat.max()) and float(bw.min()) == float(bw.max())
        self.same = (float(lat[0]), float(bw[0])) if uniform else None


class RingSteps:
    """``T[k][p]``: the time of the chunk member p sends to p+1 at step k of the ring all_reduce
    (``Route.time`` from the cached route figures, elementwise: the same floats); with ``half``
    ("reduce_scatter" or "all_gather"), of that half alone (n−1 steps).  Called with (lo, hi),
    it gives rows lo..hi−1: the whole (2(n−1), n) table is 1 MiB at 256 members, and built at once
    its fresh pages cost a device ~4 ms of CPU in its first all_reduce."""

    def __init__(self, topology: Topology, ranks: Sequence[int], chunk_nbytes: Sequence[int], caller: str,
                 half: str = "", links: RingLinks | None = None) -> None:
        n = len(ranks)
        if len(chunk_nbytes) != n:
            raise ValueError(f"{caller}: {n} ranks need {n} chunk sizes; got {len(chunk_nbytes)}")
        if half not in ("", "reduce_scatter", "all_gather"):
            raise ValueError(f"{caller}: half must be '' (the whole ring), 'reduce_scatter' or "
                             f"'all_gather', got {half!r}")
        self.links = RingLinks(topology, ranks) if links is None else links  # (``links``: kept by the caller)
        self.latency, self.bandwidth = self.links.latency, self.links.bandwidth
        self._half, self._windows, self._chunks = half, None, chunk_nbytes
        self._sizes = np.asarray(chunk_nbytes, dtype=np.float64)
        self.members = n
        self.count = 2 * (n - 1) if not half else n - 1

    def uniform(self) -> float | None:
        """The one time every step adds to every member (one latency, one bandwidth, one chunk
        size), else None; the same float as each entry of ``self(lo, hi)`` would be (the same
        IEEE operations, in Python floats: a bandwidth of inf gives 0 s, as numpy's would)."""
        same, chunks = self.links.same, self._chunks
        if not self.count or same is None or min(chunks) != max(chunks):
            return None
        size, (latency, bandwidth) = float(chunks[0]), same
        return latency + (size / bandwidth if size > 0 else 0.0)

    def __call__(self, lo: int, hi: int) -> np.ndarray:
        n = self.members
        if self._windows is None:  # (built on first use: a uniform ring never needs them)
            # reduce-scatter step s sends chunk p−s−1, all-gather step s chunk p−s: chunk (p − shift) mod n,
            # item n − shift + p of the sizes written twice, i.e. row n − shift of that array's n-wide windows
            steps = np.arange(n - 1)
            self._shift = {"": np.concatenate([steps + 1, steps]), "reduce_scatter": steps + 1,
                           "all_gather": steps}[self._half]
            self._windows = sliding_window_view(np.concatenate([self._sizes, self._sizes]), n)
        sizes = self._windows[n - self._shift[lo:hi]]
        with np.errstate(divide="ignore", invalid="ignore"):
            transfer = np.where(sizes > 0, sizes / self.bandwidth, 0.0)
        return self.latency + transfer
