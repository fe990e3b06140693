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

from operator import add
from typing import Sequence

import numpy as np

from virtualpar.mesh.topology import Topology
from virtualpar.sim.max_plus import NEVER, RingLinks, RingSteps, max_plus_column, ring_column

__all__ = ["ring_all_reduce_delays", "ring_all_reduce_column", "ring_all_reduce_times", "ring_half_column",
           "tree_children",
           "tree_broadcast_column", "dissemination_column", "tree_all_reduce_times", "tree_all_reduce_column",
           "tree_all_reduce_links", "apply_delays", "max_plus_column", "NEVER"]


def ring_all_reduce_delays(topology: Topology, ranks: Sequence[int],
                           chunk_nbytes: Sequence[int]) -> list[list[float]]:
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
    steps = RingSteps(topology, ranks, chunk_nbytes, "ring_all_reduce_delays")
    steps = steps(0, steps.count).tolist()
    rows = []
    for q in range(n):
        t = [NEVER] * n
        t[q] = 0.0
        for send in steps:
            t = [max(t[p] + send[p], t[p - 1] + send[p - 1]) for p in range(n)]  # t[-1]: member n−1
        rows.append(t)
    return rows


def ring_all_reduce_column(topology: Topology, ranks: Sequence[int], chunk_nbytes: Sequence[int], member: int,
                           links: RingLinks | None = None) -> list[float]:
    """Column ``member`` of :func:`ring_all_reduce_delays`' matrix (``D[q][member]`` for every q),
    in O(n²) instead of the matrix's O(n³): what one device needs to price its own exit.

    The schedule is ``t ↦ A_K ⊗ … ⊗ A_1 ⊗ t`` in max-plus algebra, with step k's matrix holding
    ``send_k[p]`` at (p, p) and at (p+1, p).  Row ``member`` of that product is the unit vector of
    ``member`` multiplied from the right by ``A_K``, then ``A_{K−1}``, …: step k maps u to
    ``u'[q] = send_k[q] + max(u[q], u[q+1])``.  The chains are the matrix's, summed from the last
    step back, so entries agree with the matrix to rounding (a 64-device group: ~10 ms instead of
    ~5 s of CPU per device for its first shared-memory all_reduce).  ``links``: the ring's
    :class:`~virtualpar.sim.max_plus.RingLinks`, if the caller keeps them.
    """
    return ring_column(RingSteps(topology, ranks, chunk_nbytes, "ring_all_reduce_column", links=links),
                       member)


def ring_half_column(topology: Topology, ranks: Sequence[int], piece_nbytes: Sequence[int], member: int,
                     half: str, links: RingLinks | None = None) -> list[float]:
    """Column ``member`` of the max-plus matrix of one half of the ring all_reduce over ``ranks``
    (``collectives/ring.py``) run alone, with the pieces' own sizes (they may differ), n−1 steps,
    O(n²): ``half="all_gather"``, the ring all_gather — at step s member p sends piece (p−s) mod n
    to p+1; ``"reduce_scatter"``, the ring reduce_scatter — the partial of piece (p−s−1) mod n.  On
    a uniform topology with equal pieces every entry is (n−1)(α + P/β)."""
    return ring_column(RingSteps(topology, ranks, piece_nbytes, f"ring {half} column", half, links), member)


def tree_broadcast_column(topology: Topology, ranks: Sequence[int], root: int, member: int,
                          nbytes: int) -> list[tuple[int, float]]:
    """The nonzero part of column ``member`` of the max-plus matrix of the binomial-tree broadcast
    from ``root`` over ``ranks`` (``collectives/tree.py``): ``(q, D[q][member])`` for the members q on
    the tree path from the root down to ``member``, the only ones whose entry clocks reach it.

    With v = (position − root) mod n, member v receives from v − lowbit(v), then sends to its
    children in order, largest subtree first, each send keeping it busy T = α + M/β, and a receive
    completes at ``max(t_receiver, t_sender_at_send + T)``.  So the delay from member a's entry to
    ``member``'s exit is the sum, along the path, of each node's sends up to and including the one
    to the next node, plus ``member``'s own sends: O(log² n) route figures, read at once."""
    n = len(ranks)
    v = (member - root) % n
    path = [v]
    while path[-1]:
        path.append(path[-1] - (path[-1] & -path[-1]))
    path.reverse()  # the root (v = 0) ... member
    legs = [tree_children(a, n)[: tree_children(a, n).index(b) + 1] for a, b in zip(path, path[1:])]
    legs.append(tree_children(v, n))  # member's own sends
    src = np.array([ranks[(a + root) % n] for a, leg in zip(path, legs) for _ in leg], dtype=np.intp)
    dst = np.array([ranks[(c + root) % n] for leg in legs for c in leg], dtype=np.intp)
    latency, bandwidth = topology.figures_many(src, dst) if src.size else (np.zeros(0), np.ones(0))
    with np.errstate(divide="ignore", invalid="ignore"):
        send = (latency + (nbytes / bandwidth if nbytes else 0.0)).tolist()
    out, delay, k = [], 0.0, len(send)
    for a, leg in zip(reversed(path), reversed(legs)):  # backwards from member's exit
        k -= len(leg)
        delay += sum(send[k : k + len(leg)])
        out.append(((a + root) % n, delay))
    return out


def tree_children(v: int, n: int) -> list[int]:
    """Whom member v (relative to the root, of n) sends to in the binomial-tree broadcast, in order,
    largest subtree first; it received from v − lowbit(v).  The one definition of the tree that
    ``collectives/tree.py`` runs and :func:`tree_broadcast_column` prices."""
    mask = 1
    while mask < n and not v & mask:
        mask <<= 1
    mask >>= 1
    out = []
    while mask > 0:
        if v + mask < n:
            out.append(v + mask)
        mask >>= 1
    return out


def dissemination_column(topology: Topology, ranks: Sequence[int], member: int) -> list[float]:
    """Column ``member`` of the max-plus matrix of the dissemination barrier over ``ranks``
    (``collectives/direct.py``): in round k member p sends an empty message to p + 2^k and receives
    one from p − 2^k, so it leaves the round at ``max(t_p + α(p→p+2^k), t_{p−2^k} + α(p−2^k→p))``.
    ⌈log2 n⌉ rounds, O(n log n).  On a uniform topology every entry is ⌈log2 n⌉·α.
    """
    n = len(ranks)
    offsets = [1 << k for k in range(max(n - 1, 0).bit_length())]
    rk = np.asarray(ranks)
    latencies = [topology.figures_many(rk, np.roll(rk, -k))[0] for k in offsets]
    steps = np.array(latencies).reshape(len(offsets), n)  # T(0) = α
    return max_plus_column(lambda lo, hi: steps[lo:hi], offsets, member, n)


def tree_all_reduce_times(topology: Topology, ranks: Sequence[int], entry: Sequence[float],
                          nbytes: int) -> list[float]:
    """Exit clock of every member of the recursive-doubling all_reduce (``collectives/tree.py``)
    over ``ranks`` entered at ``entry``, by the clock's message rules (a blocking send keeps its
    sender busy T = α + M/β from its post; a receive completes at max(own clock, post + T)):

    - fold, the e = n − p members above p = 2^⌊log2 n⌋: r sends to r − p, which receives;
    - log2 p rounds of ``sendrecv`` with r XOR 2^k: t_r ← max(t_r + T(r→q), t_q + T(q→r));
    - unfold: r < e sends the result to r + p, which receives it.

    O(n log n) per call; exact on links idle at entry, as :func:`ring_all_reduce_delays` is.
    """
    return _tree_replay(topology, ranks, np.array(entry, dtype=np.float64).reshape(-1, 1),
                        nbytes)[:, 0].tolist()


def tree_all_reduce_links(topology: Topology,
                          ranks: Sequence[int]) -> tuple[list[tuple], np.ndarray, np.ndarray, bool]:
    """What :func:`tree_all_reduce_column` needs of the topology, which depends on the group and
    not on the size: the steps in the order the column takes them back (the unfold, the rounds from
    the last, the fold), each as (members it updates: a slice, members they wait for, its messages'
    span); all the steps' (latency, bandwidth), end to end; and whether the group is *uniform*: a
    power of two (no fold) with one latency and one bandwidth.  Kept per group by the clock: a new
    size costs one division and three numpy operations per step (a uniform group: log2 n additions),
    not ⌈log2 n⌉ + 2 route lookups."""
    n = len(ranks)
    if n == 1:
        return [], np.zeros(0), np.ones(0), False
    rk = np.asarray(ranks)
    p = 1 << (n.bit_length() - 1)
    steps = [(slice(0, n - p), slice(p, n))]  # unfold: r < e sent to r + p, which waited
    # rounds, last first
    steps += [(slice(0, p), np.arange(p) ^ (1 << k)) for k in range(p.bit_length() - 2, -1, -1)]
    steps.append((slice(p, n), slice(0, n - p)))  # fold: r ≥ p sent to r − p
    latency, bandwidth = topology.figures_many(*(np.concatenate([rk[step[i]] for step in steps])
                                                 for i in (0, 1)))
    bounds = np.cumsum([0] + [rk[a].size for a, _ in steps]).tolist()
    uniform = n == p and all(float(a.min()) == float(a.max()) for a in (latency, bandwidth))
    return [(a, b, lo, hi) for (a, b), lo, hi in zip(steps, bounds, bounds[1:])], latency, bandwidth, uniform


def tree_all_reduce_column(topology: Topology, ranks: Sequence[int], me: int, nbytes: int,
                           links: tuple | None = None) -> list[float]:
    """Member ``me``'s row of the max-plus matrix of :func:`tree_all_reduce_times` (every step is
    a max of sums): ``exit[me] = max_q (entry[q] + row[q])``, via :func:`apply_delays` — O(n) per
    call once the row is kept.  The row is the unit vector of ``me`` taken back through the steps
    from the last, as :func:`max_plus_column` does for the ring: a step ``t'[r] = max(t[r] + a,
    t[q] + b)`` maps ``u`` to ``u[r] = max(u'[r] + a, u'[j] + c)`` over the members j it feeds —
    O(n log n) (the forward replay of n unit vectors, O(n² log n), cost ~3 ms of a first call at 128
    devices).  ``links``: :func:`tree_all_reduce_links` of the group, if kept.  In a uniform group
    every round adds one time T to every member, and after the log2 n rounds back every member has
    a chain to ``me``: every entry is T added log2 n times (the same floats as the walk)."""
    steps, latency, bandwidth, uniform = tree_all_reduce_links(topology, ranks) if links is None else links
    if uniform:
        total, step = 0.0, float(latency[0] + (nbytes / bandwidth[0] if nbytes else 0.0))
        for _ in steps[1:-1]:  # the rounds (the unfold and the fold are empty)
            total = total + step
        return [total] * len(ranks)
    times = latency + (nbytes / bandwidth if nbytes else 0.0)  # every step's messages at once
    u = np.full(len(ranks), NEVER)
    u[me] = 0.0
    for a, b, lo, hi in steps:  # a view; b's items lie apart from it (a slice) or are copied
        part = u[a]
        np.add(np.maximum(part, u[b], out=part), times[lo:hi], out=part)
    return u.tolist()


def _tree_replay(topology: Topology, ranks: Sequence[int], t: np.ndarray, nbytes: int) -> np.ndarray:
    """The recurrence of :func:`tree_all_reduce_times` on clocks ``t`` of shape (n, k): row r is
    member r's clock (k = 1), or its clocks from each of k entry unit vectors.  Each step runs on
    every member at once, its message times looked up with one ``figures_many`` (the same float
    operations, element by element, as a replay member by member)."""
    n = len(ranks)
    if n == 1:
        return t
    rk = np.asarray(ranks)

    def T(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # message times a[i] -> b[i], as a column
        lat, bw = topology.figures_many(rk[a], rk[b])
        return (lat + (nbytes / bw if nbytes else 0.0))[:, None]

    p = 1 << (n.bit_length() - 1)
    lo, hi = np.arange(n - p), np.arange(p, n)
    posted = t[hi].copy()  # fold: r ≥ p posts its array to r − p and waits for the send
    t[hi] = posted + T(hi, hi - p)
    t[lo] = np.maximum(t[lo], posted + T(hi, lo))
    r, mask = np.arange(p), 1
    while mask < p:
        q, before = r ^ mask, t[:p].copy()
        t[:p] = np.maximum(before + T(r, q), before[q] + T(q, r))
        mask <<= 1
    post, back = t[lo].copy(), T(lo, lo + p)  # unfold: the result goes back to r + p, blocked in its receive
    t[lo] = post + back
    t[hi] = np.maximum(t[hi], post + back)
    return t


def apply_delays(column: Sequence[float], entry: Sequence[float]) -> float:
    """``max_q (entry[q] + column[q])``: the exit clock of the member whose column of ``D`` this is."""
    return float(max(map(add, entry, column)))


def ring_all_reduce_times(topology: Topology, ranks: Sequence[int], entry: Sequence[float],
                          chunk_nbytes: Sequence[int]) -> list[float]:
    """Exit clock of every member of the ring all_reduce over ``ranks`` entered at clocks ``entry``
    (``entry[p]``: member p's clock on entering); see :func:`ring_all_reduce_delays`."""
    n = len(ranks)
    if len(entry) != n:
        raise ValueError(f"ring_all_reduce_times: {n} ranks need {n} entry clocks; got {len(entry)}")
    if n == 1:
        return [float(entry[0])]
    delays = ring_all_reduce_delays(topology, ranks, chunk_nbytes)
    return [apply_delays([row[p] for row in delays], entry) for p in range(n)]
