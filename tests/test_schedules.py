"""Schedules priced without running them (sim/schedules.py) and the clock's cached charge.

The max-plus matrix is checked against an independent step-by-step replay of the ring (the
recursion of the module docstring, written out here with the clock's formulas), on uneven
topologies, uneven entry clocks and uneven chunks; and against a hand-worked two-member case.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from virtualpar.mesh import Topology
from virtualpar.sim import analytic
from virtualpar.sim.clock import DeviceClock
from virtualpar.sim.schedules import ring_all_reduce_column, ring_all_reduce_delays, ring_all_reduce_times


def replay_ring(topology, ranks, entry, chunks):
    """The ring all_reduce, step by step: member p leaves a step at
    max(t_p, t_p + T(p->p+1, its chunk), t_{p-1} + α + m/β of the chunk it receives)."""
    n = len(ranks)
    t = list(map(float, entry))
    for offset in (1, 0):
        for s in range(n - 1):
            sizes = [chunks[(p - s - offset) % n] for p in range(n)]
            new = []
            for p in range(n):
                left = (p - 1) % n
                into = topology.route(ranks[left], ranks[p])
                out = topology.route(ranks[p], ranks[(p + 1) % n])
                arrival = t[left] + into.latency + (sizes[left] / into.bandwidth if sizes[left] else 0.0)
                new.append(max(t[p], arrival,
                               t[p] + out.latency + (sizes[p] / out.bandwidth if sizes[p] else 0.0)))
            t = new
    return t


TOPOLOGIES = {
    "hierarchical 2x4": Topology.hierarchical(2, 4),
    "torus 2x4": Topology.torus2d(2, 4),
    "ring 8": Topology.ring(8),
    "fully connected 8": Topology.fully_connected(8),
}


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(TOPOLOGIES)), data=st.data())
def test_max_plus_matrix_equals_the_step_replay(name, data):
    topo = TOPOLOGIES[name]
    ranks = data.draw(st.lists(st.integers(0, 7), min_size=2, max_size=8, unique=True), label="ranks")
    n = len(ranks)
    entry = data.draw(st.lists(st.floats(0, 1e-3), min_size=n, max_size=n), label="entry")
    chunks = data.draw(st.lists(st.integers(0, 1 << 24), min_size=n, max_size=n), label="chunks")
    got = ring_all_reduce_times(topo, ranks, entry, chunks)
    assert got == pytest.approx(replay_ring(topo, ranks, entry, chunks), rel=1e-12, abs=1e-18)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(TOPOLOGIES)), data=st.data())
def test_one_column_equals_the_matrix_column(name, data):
    topo = TOPOLOGIES[name]
    ranks = data.draw(st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True), label="ranks")
    n = len(ranks)
    chunks = data.draw(st.lists(st.integers(0, 1 << 24), min_size=n, max_size=n), label="chunks")
    matrix = ring_all_reduce_delays(topo, ranks, chunks)
    for me in range(n):
        assert ring_all_reduce_column(topo, ranks, chunks,
                                      me) == pytest.approx([row[me] for row in matrix], rel=1e-12, abs=1e-18)


def test_column_by_hand_for_two_members():
    topo = Topology.fully_connected(2, latency=1.0, bandwidth=1.0)
    assert ring_all_reduce_column(topo, [0, 1], [2, 4], 0) == [10.0, 8.0]  # see the matrix below
    assert ring_all_reduce_column(topo, [0, 1], [2, 4], 1) == [10.0, 8.0]


def test_matrix_by_hand_for_two_members():
    topo = Topology.fully_connected(2, latency=1.0, bandwidth=1.0)  # a message of m bytes: 1 + m s
    # two steps of a 2-byte chunk each way: every chain is 3 + 3 long, and each member reaches the other
    assert ring_all_reduce_delays(topo, [0, 1], [2, 2]) == [[6.0, 6.0], [6.0, 6.0]]
    # uneven chunks: step 1 sends chunk 1 from member 0 (1 + 4 s) and chunk 0 from member 1 (1 + 2 s),
    # step 2 chunk 0 from member 0 and chunk 1 from member 1.  From member 0's entry both reach 5
    # after step 1, then max(5 + 3, 5 + 5) = 10; from member 1's, 3 and then max(3 + 3, 3 + 5) = 8
    assert ring_all_reduce_delays(topo, [0, 1], [2, 4]) == [[10.0, 10.0], [8.0, 8.0]]
    assert ring_all_reduce_times(topo, [0, 1], [0.0, 10.0], [2, 4]) == [18.0, 18.0]


def test_uniform_topology_gives_the_closed_form_in_every_entry():
    a, b, n = 2e-6, 450e9, 4
    M = 3 << 20
    d = ring_all_reduce_delays(Topology.fully_connected(n, latency=a, bandwidth=b), range(n), [M // n] * n)
    assert np.allclose(d, analytic.ring_all_reduce(n, M, a, b), rtol=1e-12, atol=0)


def test_clock_charge_is_cached_per_group_and_chunks_and_bounded(monkeypatch):
    topo = Topology.hierarchical(2, 2)
    clock = DeviceClock(2, topo)
    ranks, chunks = (0, 2), [1 << 20, 1 << 20]
    want = replay_ring(topo, ranks, [0.5, 0.25], chunks)[1]
    assert clock.ring_all_reduce(ranks, [0.5, 0.25], chunks) == pytest.approx(want, rel=1e-12)
    assert len(clock._schedules) == 2  # the column, and the group's ring links (for its next size)
    # a later call with other entry clocks reuses the column and still prices them
    want = replay_ring(topo, ranks, [1.0, 3.0], chunks)[1]
    assert clock.ring_all_reduce(ranks, [1.0, 3.0], chunks) == pytest.approx(want, rel=1e-12)
    assert len(clock._schedules) == 2
    # never backwards: a charge that ends before now leaves now alone
    assert clock.ring_all_reduce(ranks, [0.0, 0.0], chunks) == clock.now == pytest.approx(want, rel=1e-12)
    monkeypatch.setattr("virtualpar.sim.schedule_charges._SCHEDULES_KEPT", 3)
    for m in range(10):
        clock.ring_all_reduce(ranks, [0.0, 0.0], [m, m])
        assert len(clock._schedules) <= 3


@pytest.mark.parametrize("topo",
                         [Topology.fully_connected(8, latency=2e-6, bandwidth=45e9),
                          Topology.hierarchical(2, 4),
                                  Topology.fully_connected(6, latency=2e-6, bandwidth=45e9)])
def test_a_uniform_column_is_kept_as_one_float_and_charges_the_same_bits(topo):
    """ScheduleCharges keeps a column whose entries are all equal as that float and charges
    max(entry) + c; that must be the bits max_q(entry[q] + column[q]) gives, on a flat topology
    (uniform: barrier, power-of-two tree, ring), a hierarchy (the ring not uniform), and 6 members
    (the tree's fold: not uniform)."""
    from virtualpar.sim.schedules import (
        apply_delays,
        dissemination_column,
        ring_all_reduce_column,
        tree_all_reduce_column,
    )

    n = topo.num_devices
    ranks = tuple(range(n))
    rng = np.random.default_rng(n)
    kinds = {"barrier": lambda me: dissemination_column(topo, ranks, me),
             "tree": lambda me: tree_all_reduce_column(topo, ranks, me, 4096),
             "ring": lambda me: ring_all_reduce_column(topo, ranks, [1 << 16] * n, me)}
    charge = {"barrier": lambda c, e: c.dissemination_barrier(ranks, e),
              "tree": lambda c, e: c.tree_all_reduce(ranks, e, 4096),
              "ring": lambda c, e: c.ring_all_reduce(ranks, e, [1 << 16] * n)}
    seen = set()
    for kind, column_of in kinds.items():
        for me in range(n):
            clock = DeviceClock(me, topo)
            for _ in range(3):  # the first call computes and keeps the column, the next ones reuse it
                entry = (rng.random(n) * 1e-3).tolist()
                want = max(clock.now, apply_delays(column_of(me), entry))
                assert charge[kind](clock, entry) == want
            kept = [v for k, v in clock._schedules.items() if kind in k or k[1:] == ((1 << 16,) * n,)]
            seen.add((kind, type(kept[0]) is float))
    if Topology.fully_connected(n, latency=2e-6, bandwidth=45e9) == topo:
        assert seen == {("barrier", True), ("ring", True), ("tree", n & (n - 1) == 0)}
    else:  # the ring crosses the slower link between the nodes: members' chains differ
        assert ("ring", False) in seen


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 33])
@pytest.mark.parametrize("half", ["", "all_gather", "reduce_scatter"])
def test_a_uniform_ring_s_closed_form_column_is_the_walk_s_to_the_bit(n, half):
    """ring_column skips the O(n²) walk when every step adds one time to every member (one
    latency, one bandwidth, one chunk size); it must return exactly the walk's floats, and a ring
    that crosses a slower link (two nodes of a hierarchy), or moves one other chunk size, must be
    told apart and still match the walk."""
    from virtualpar.sim.max_plus import RingLinks, RingSteps, max_plus_column, ring_column

    uniform = Topology.fully_connected(n, latency=2e-6, bandwidth=45e9)
    cases = [(uniform, [3000] * n, True), (uniform, [0] * n, True),
             (uniform, [3000] * (n - 1) + [3008], False)]
    if n % 2 == 0 and n > 2:  # two nodes: the ring crosses the slower inter-node link twice
        cases.append((Topology.hierarchical(2, n // 2), [3000] * n, False))
    for topo, chunks, closed in cases:
        for me in range(n):
            steps = RingSteps(topo, range(n), chunks, "test", half)
            assert (steps.uniform() is not None) == (closed and n > 1)
            walk = max_plus_column(steps, [1] * steps.count, me, n)
            assert ring_column(steps, me) == walk
            # as a clock keeps them
            kept = RingSteps(topo, range(n), chunks, "test", half, RingLinks(topo, list(range(n))))
            assert ring_column(kept, me) == walk and kept.uniform() == steps.uniform()
            if n > 1:
                assert all(np.isfinite(walk))


@pytest.mark.parametrize("n", [1, 2, 4, 8, 64])
def test_a_uniform_tree_s_closed_form_column_is_the_walk_s_to_the_bit(n):
    """tree_all_reduce_column adds one time log2 n times in a uniform group (a power of two, one
    latency, one bandwidth); it must be the walk's floats exactly.  A group with a slower link,
    or of 6 members (the fold), must be marked non-uniform and walk."""
    from virtualpar.sim.schedules import tree_all_reduce_column, tree_all_reduce_links

    topo = Topology.fully_connected(n, latency=2e-6, bandwidth=45e9)
    steps, latency, bandwidth, uniform = links = tree_all_reduce_links(topo, range(n))
    assert uniform == (n > 1)
    for nbytes in (0, 8, 3000, 1 << 20):
        for me in range(n):
            walked = tree_all_reduce_column(topo, range(n), me, nbytes, (steps, latency, bandwidth, False))
            assert tree_all_reduce_column(topo, range(n), me, nbytes, links) == walked
    assert not tree_all_reduce_links(Topology.hierarchical(2, 4), range(8))[3]
    assert not tree_all_reduce_links(Topology.fully_connected(6), range(6))[3]
