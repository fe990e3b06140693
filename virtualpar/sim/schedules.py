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
"""

from __future__ import annotations

from typing import Sequence

from virtualpar.mesh.topology import Topology

__all__ = ["ring_all_reduce_times"]


def ring_all_reduce_times(topology: Topology, ranks: Sequence[int], entry: Sequence[float], chunk_nbytes: Sequence[int]) -> list[float]:
    """Exit clock of every member of the ring all_reduce over ``ranks`` (see ``collectives/ring.py``).

    ``entry[p]``: member p's clock on entering; ``chunk_nbytes[c]``: bytes of ring chunk c (the
    ``numpy.array_split`` of the flattened array into n chunks).  2(n−1) steps: in reduce-scatter
    step s member p sends chunk (p−s−1) mod n to p+1, in all-gather step s chunk (p−s) mod n;
    each step is a ``sendrecv``, so member p leaves it at
    ``max(t_p + T(p→p+1), t_{p−1} + α + m/β)``.  On a uniform topology with equal entry clocks this
    is the closed form 2(n−1)(α + M/(nβ)) of :func:`~virtualpar.sim.analytic.ring_all_reduce`.
    """
    n = len(ranks)
    if len(entry) != n or len(chunk_nbytes) != n:
        raise ValueError(f"ring_all_reduce_times: {n} ranks need {n} entry clocks and {n} chunk sizes; "
                         f"got {len(entry)} and {len(chunk_nbytes)}")
    t = [float(v) for v in entry]
    if n == 1:
        return t
    routes = [topology.route(ranks[p], ranks[(p + 1) % n]) for p in range(n)]  # p -> p+1
    for phase_offset in (1, 0):  # reduce-scatter sends chunk p−s−1, all-gather chunk p−s
        for s in range(n - 1):
            sizes = [chunk_nbytes[(p - s - phase_offset) % n] for p in range(n)]
            new = []
            for p in range(n):
                left = (p - 1) % n
                into = routes[left]
                arrival = t[left] + into.latency + (sizes[left] / into.bandwidth if sizes[left] else 0.0)
                new.append(max(t[p], arrival, t[p] + routes[p].time(sizes[p])))
            t = new
    return t
