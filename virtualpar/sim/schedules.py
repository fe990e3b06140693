"""Modelled time of a collective *schedule* computed without running it, from the members' entry clocks.

Shared-memory algorithms move no messages, so no envelope carries a departure stamp for the
:class:`~virtualpar.sim.clock.DeviceClock` to price.  They are charged instead as the message
algorithm real hardware would run, replayed here step by step with the very formulas the clock
applies to real messages (Hockney, single port)::

    a send of m bytes from s to d, posted at t_s:   the sender is busy until  t_s + T_route(m)
    its receive at d completes at                   max(t_d, t_s + α_route + m/β_route)

so on a topology whose links are idle at entry, the replay gives every member exactly the clock
it would have had after running the message algorithm itself.  (A member's own links are idle at
entry once its earlier sends were waited on; contention on shared middle links is not modelled
by the clock either.)  Every member computes the same list from the same entry clocks.

A schedule is a **max-plus linear map** of the entry clocks.  A step only adds constants to clocks
and takes maxima (``t'_p = max(t_p + a, t_q + b)``), and so does any composition of steps, hence::

    exit_p = max_q ( entry_q + D[q][p] )

where ``D[q][p]`` is the longest chain of step delays from member q's entry to member p's exit
(−inf if none).  ``D`` depends only on the topology, the group and the chunk sizes: a device
computes it once (2(n−1)·n² float operations) and then prices each call in n additions — the
shared-memory all_reduce at 4 devices spent ~30 µs per call replaying the steps before.
"""

from __future__ import annotations

from typing import Sequence

from virtualpar.mesh.topology import Topology

__all__ = ["ring_all_reduce_delays", "ring_all_reduce_times", "apply_delays"]

NEVER = float("-inf")  # max-plus zero: no chain of steps leads from one clock to the other


def ring_all_reduce_delays(topology: Topology, ranks: Sequence[int], chunk_nbytes: Sequence[int]) -> list[list[float]]:
    """The ring all_reduce over ``ranks`` (see ``collectives/ring.py``) as a max-plus matrix ``D``.

    ``chunk_nbytes[c]``: bytes of ring chunk c (the ``numpy.array_split`` of the flattened array
    into n chunks).  2(n−1) steps: in reduce-scatter step s member p sends chunk (p−s−1) mod n to
    p+1, in all-gather step s chunk (p−s) mod n; each step is a ``sendrecv``, so member p leaves
    it at ``max(t_p + T(p→p+1, m_p), t_{p−1} + T(p−1→p, m_{p−1}))`` (its own send keeps it busy
    for ``T ≥ 0``, so ``t_p`` itself never wins).  Row q is that recursion run from the max-plus
    unit vector of q.  On a uniform topology ``D[q][p] = 2(n−1)(α + M/(nβ))`` for every q, p:
    the closed form of :func:`~virtualpar.sim.analytic.ring_all_reduce`.
    """
    n = len(ranks)
    if len(chunk_nbytes) != n:
        raise ValueError(f"ring_all_reduce_delays: {n} ranks need {n} chunk sizes; got {len(chunk_nbytes)}")
    routes = [topology.route(ranks[p], ranks[(p + 1) % n]) for p in range(n)]  # p -> p+1
    steps = []  # per step, T(p -> p+1) of the chunk member p sends
    for phase_offset in (1, 0):  # reduce-scatter sends chunk p−s−1, all-gather chunk p−s
        for s in range(n - 1):
            steps.append([routes[p].time(chunk_nbytes[(p - s - phase_offset) % n]) for p in range(n)])
    rows = []
    for q in range(n):
        t = [NEVER] * n
        t[q] = 0.0
        for send in steps:
            t = [max(t[p] + send[p], t[p - 1] + send[p - 1]) for p in range(n)]  # t[-1]: member n−1
        rows.append(t)
    return rows


def apply_delays(column: Sequence[float], entry: Sequence[float]) -> float:
    """``max_q (entry[q] + column[q])``: the exit clock of the member whose column of ``D`` this is."""
    return max(float(e) + d for e, d in zip(entry, column))


def ring_all_reduce_times(topology: Topology, ranks: Sequence[int], entry: Sequence[float], chunk_nbytes: Sequence[int]) -> list[float]:
    """Exit clock of every member of the ring all_reduce over ``ranks`` entered at clocks ``entry``
    (``entry[p]``: member p's clock on entering); see :func:`ring_all_reduce_delays`."""
    n = len(ranks)
    if len(entry) != n:
        raise ValueError(f"ring_all_reduce_times: {n} ranks need {n} entry clocks; got {len(entry)}")
    if n == 1:
        return [float(entry[0])]
    delays = ring_all_reduce_delays(topology, ranks, chunk_nbytes)
    return [apply_delays([row[p] for row in delays], entry) for p in range(n)]
