"""Closed-form collective costs in the α–β (Hockney) model.

Notation: ``n`` devices in the group, ``M`` bytes of the *full* array on each device, every link has
latency α (``a``, seconds) and bandwidth β (``b``, bytes/second), so one message of ``m`` bytes
costs ``α + m/β``.  A group of one device costs 0.  Reduction arithmetic is free here (price it with
``DeviceSpec.compute_time``).

Two sending models appear below:

* **single-port, blocking** (Hockney's, used by Thakur, Rabenseifner & Gropp 2005): a device sends
  one message at a time and is busy until it is delivered.  This is the default everywhere.
* **concurrent** (``concurrent=True``): a device may have messages in flight to several peers at
  once, each over its own dedicated link — what :class:`~virtualpar.sim.clock.DeviceClock` computes
  on ``Topology.fully_connected``, whose sends are asynchronous and whose links are per pair.

Ring algorithms send one message per step per device, so both models agree on them.

References: R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of Collective Communication
Operations in MPICH", IJHPCA 19(1), 2005; P. Patarasuk, X. Yuan, "Bandwidth optimal all-reduce
algorithms for clusters of workstations", JPDC 69(2), 2009; R. Hockney, "The communication
challenge for MPP", Parallel Computing 20(3), 1994.
"""

from __future__ import annotations

import math

__all__ = [
    "p2p",
    "RING_STEPS",
    "ring_time",
    "ring_all_reduce",
    "ring_all_gather",
    "ring_reduce_scatter",
    "tree_broadcast",
    "direct_all_reduce",
    "two_shot_all_reduce",
]


def _check(n: int, M: float, a: float, b: float) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"group size n must be a positive int; got {n!r}")
    if not M >= 0:
        raise ValueError(f"message size M must be >= 0 bytes; got {M!r}")
    if not (a >= 0 and math.isfinite(a)):
        raise ValueError(f"latency a must be a finite number of seconds >= 0; got {a!r}")
    if not b > 0:
        raise ValueError(f"bandwidth b must be > 0 bytes/second; got {b!r}")


def p2p(M: float, a: float, b: float) -> float:
    """One message of ``M`` bytes: ``α + M/β`` (Hockney 1994)."""
    _check(2, M, a, b)
    return a + M / b


#: Steps of each ring collective over ``n`` devices; in every step each device sends one message.
RING_STEPS = {
    "all_reduce": lambda n: 2 * (n - 1),
    "all_gather": lambda n: n - 1,
    "reduce_scatter": lambda n: n - 1,
    "all_to_all": lambda n: n - 1,
}


def ring_time(kind: str, n: int, sent: float, a: float, b: float) -> float:
    """α–β time of the ring collective ``kind`` over ``n`` devices from the bytes ``sent`` by each
    device: ``steps·α + sent/β`` (``steps`` from :data:`RING_STEPS`).  The same figure as
    :func:`ring_all_reduce` for ``sent = 2(n−1)M/n``, as :func:`ring_all_gather` and
    :func:`ring_reduce_scatter` for ``sent = (n−1)M/n``; ``all_to_all`` sends ``(n−1)/n`` of its
    array, one piece to each peer in turn.  What the policy table and the redistribution plans read."""
    if kind not in RING_STEPS:
        raise ValueError(f"ring_time: unknown collective {kind!r}; expected one of {', '.join(RING_STEPS)}")
    _check(n, sent, a, b)
    return RING_STEPS[kind](n) * a + sent / b


def ring_all_reduce(n: int, M: float, a: float, b: float) -> float:
    """Ring all-reduce: ``2(n−1)(α + M/(nβ))``.

    Reduce-scatter then all-gather around a ring, each ``n−1`` steps in which every device sends
    one chunk of ``M/n`` bytes to its right neighbour and receives one from its left.  Bandwidth
    optimal: every device sends ``2(n−1)M/n`` bytes (Patarasuk & Yuan 2009; Thakur et al. 2005 §4.4).
    """
    _check(n, M, a, b)
    return 2 * (n - 1) * (a + M / (n * b))


def ring_all_gather(n: int, M: float, a: float, b: float) -> float:
    """Ring all-gather of an ``M``-byte result (``M/n`` from each device): ``(n−1)(α + M/(nβ))``.

    ``n−1`` steps; in step ``k`` each device forwards the chunk it received in step ``k−1``
    (Thakur et al. 2005 §3.1).
    """
    _check(n, M, a, b)
    return (n - 1) * (a + M / (n * b))


def ring_reduce_scatter(n: int, M: float, a: float, b: float) -> float:
    """Ring reduce-scatter of an ``M``-byte input (``M/n`` result per device): ``(n−1)(α + M/(nβ))``.

    The mirror image of the ring all-gather: ``n−1`` steps of one ``M/n`` chunk each, adding the
    received partial sum into the local chunk before forwarding it (Thakur et al. 2005 §4.4).
    """
    _check(n, M, a, b)
    return (n - 1) * (a + M / (n * b))


def tree_broadcast(n: int, M: float, a: float, b: float, *, concurrent: bool = False) -> float:
    """Binomial-tree broadcast of ``M`` bytes: ``⌈log₂ n⌉(α + M/β)`` (Thakur et al. 2005 §3.2).

    Round ``k`` (k = 0, 1, ...): every device ``r < 2^k`` that holds the data sends all ``M`` bytes
    to ``r + 2^k`` if that exists; after ``⌈log₂ n⌉`` rounds everyone has it.  That count assumes
    a device sends one message per round (single-port, blocking).

    ``concurrent=True``: a device fires its sends to all its children at once over separate links, so
    the time is the tree's *depth* instead of its round count.  Device ``r`` sits at depth
    popcount(r), and ``max_{r<n} popcount(r) = ⌊log₂ n⌋``, giving ``⌊log₂ n⌋(α + M/β)`` — one step
    less than the rounds when ``n`` is not a power of two.
    """
    _check(n, M, a, b)
    if n == 1:
        return 0.0
    steps = (n.bit_length() - 1) if concurrent else (n - 1).bit_length()  # ⌊log₂ n⌋ / ⌈log₂ n⌉
    return steps * (a + M / b)


def direct_all_reduce(n: int, M: float, a: float, b: float, *, concurrent: bool = False) -> float:
    """Direct (one-shot) all-reduce, as ``algorithm="direct"`` runs it: every device sends its whole
    ``M`` bytes to each of its ``n−1`` peers and reduces the ``n`` arrays itself — ``(n−1)M`` bytes
    sent per device, ``n/2`` times the ring's, in one step.

    * single-port, blocking: the ``n−1`` messages go one after another, ``(n−1)(α + M/β)``.
    * ``concurrent=True``: all of them in flight at once on dedicated links, ``α + M/β`` (what the
      modelled clock charges on a fully connected topology; with one shared injection port per
      device the bytes would still serialize: ``α + (n−1)M/β``).
    """
    _check(n, M, a, b)
    if n == 1:
        return 0.0
    return (1 if concurrent else n - 1) * (a + M / b)


def two_shot_all_reduce(n: int, M: float, a: float, b: float, *, concurrent: bool = False) -> float:
    """Two-shot all-reduce: reduce-scatter then all-gather, each peer addressed directly.

    Every device owns the ``M/n`` slice with its index.  Phase 1 (reduce-scatter): it sends slice
    ``j`` to device ``j`` for each of the ``n−1`` peers and sums the ``n−1`` slices it receives.
    Phase 2 (all-gather): it sends its reduced slice to each peer.  Each device sends
    ``2(n−1)M/n`` bytes in ``2(n−1)`` messages — the same bytes as the ring.

    * single-port, blocking: the messages go one after another, ``2(n−1)(α + M/(nβ))``.
    * ``concurrent=True``: all ``n−1`` messages of a phase are in flight at once on dedicated
      links, ``2(α + M/(nβ))``.  (With one shared injection port of bandwidth β per device — a real
      NVSwitch — the bytes would still serialize: ``2(α + (n−1)M/(nβ))``.)
    """
    _check(n, M, a, b)
    if n == 1:
        return 0.0
    messages = 2 if concurrent else 2 * (n - 1)
    return messages * (a + M / (n * b))
