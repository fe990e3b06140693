"""DeviceClock: hand-driven messages and collectives checked against α–β closed forms."""

from __future__ import annotations

import math
import pickle
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from virtualpar.errors import MeshError, UsageError
from virtualpar.mesh.topology import Topology
from virtualpar.sim import analytic
from virtualpar.sim.clock import DeviceClock
from virtualpar.sim.hardware import IDEAL_DEVICE, DeviceSpec

REL = 1e-12
A, B = 7e-6, 3e9          # α (s), β (B/s)
M = 12 * 2**20            # bytes of the full array (divisible by 1..8 is not needed: M/n is a float)


def clocks(topo: Topology, device: DeviceSpec = IDEAL_DEVICE) -> list[DeviceClock]:
    return [DeviceClock(r, topo, device) for r in range(topo.num_devices)]


# --- point to point ------------------------------------------------------------------------------

@pytest.mark.parametrize("nbytes", [0, 1, 4096, M])
def test_p2p_costs_alpha_plus_m_over_beta(nbytes):
    s, r = clocks(Topology.fully_connected(2, latency=A, bandwidth=B))
    stamp = s.on_send(1, nbytes)
    assert stamp == 0.0
    arrival = r.on_recv(0, nbytes, stamp)
    assert arrival == pytest.approx(A + nbytes / B, rel=REL)
    assert arrival == pytest.approx(analytic.p2p(nbytes, A, B), rel=REL)
    assert r.now == arrival
    assert s.now == 0.0  # the send is asynchronous: the sender does not wait


def test_p2p_departs_at_sender_now():
    s, r = clocks(Topology.fully_connected(2, latency=A, bandwidth=B))
    s.advance_to(1.5)
    assert r.on_recv(0, M, s.on_send(1, M)) == pytest.approx(1.5 + A + M / B, rel=REL)


def test_receiver_already_later_keeps_its_time():
    s, r = clocks(Topology.fully_connected(2, latency=A, bandwidth=B))
    r.advance_to(10.0)
    arrival = r.on_recv(0, M, s.on_send(1, M))
    assert arrival == pytest.approx(A + M / B, rel=REL) and r.now == 10.0


def test_same_link_twice_by_one_sender_serializes():
    s, r = clocks(Topology.fully_connected(2, latency=A, bandwidth=B))
    t1, t2 = s.on_send(1, M), s.on_send(1, M)
    assert (t1, t2) == (0.0, pytest.approx(M / B, rel=REL))
    assert s.now == 0.0 and s.busy_until(0, 1) == pytest.approx(2 * M / B, rel=REL)
    assert r.on_recv(0, M, t1) == pytest.approx(A + M / B, rel=REL)
    assert r.on_recv(0, M, t2) == pytest.approx(A + 2 * M / B, rel=REL)


def test_different_links_from_one_sender_overlap():
    s, r1, r2 = clocks(Topology.fully_connected(3, latency=A, bandwidth=B))
    t1, t2 = s.on_send(1, M), s.on_send(2, M)
    assert t1 == t2 == 0.0
    assert r1.on_recv(0, M, t1) == r2.on_recv(0, M, t2) == pytest.approx(A + M / B, rel=REL)


def test_same_ingress_link_into_one_receiver_serializes():
    # 2 nodes x 2 devices: 0 and 1 both reach 2 through node1-switch -> 2 (one ingress link)
    ia, ib, ea, eb = 1e-6, 100e9, 2e-6, 10e9
    topo = Topology.hierarchical(2, 2, ia, ib, ea, eb)
    c = clocks(topo)
    assert topo.route(0, 2).links[-1] == topo.route(1, 2).links[-1] == ("node1-switch", 2)
    t0, t1 = c[0].on_send(2, M), c[1].on_send(2, M)
    assert t0 == t1 == 0.0
    first = c[2].on_recv(0, M, t0)
    second = c[2].on_recv(1, M, t1)
    assert first == pytest.approx(4 * ea + M / eb, rel=REL)
    assert second == pytest.approx(4 * ea + 2 * M / eb, rel=REL)
    # in the other program order the roles swap: the model follows the receiver's program order
    c = clocks(topo)
    t0, t1 = c[0].on_send(2, M), c[1].on_send(2, M)
    assert c[2].on_recv(1, M, t1) == pytest.approx(first, rel=REL)
    assert c[2].on_recv(0, M, t0) == pytest.approx(second, rel=REL)


def test_shared_egress_link_to_different_receivers_serializes():
    # 0 reaches 2 and 3 (other node) through its one NIC link 0 -> node0-switch
    ea, eb = 2e-6, 10e9
    c = clocks(Topology.hierarchical(2, 2, 1e-6, 100e9, ea, eb))
    t2, t3 = c[0].on_send(2, M), c[0].on_send(3, M)
    assert (t2, t3) == (0.0, pytest.approx(M / eb, rel=REL))
    assert c[2].on_recv(0, M, t2) == pytest.approx(4 * ea + M / eb, rel=REL)
    assert c[3].on_recv(0, M, t3) == pytest.approx(4 * ea + 2 * M / eb, rel=REL)
    assert c[0].now == 0.0


def test_different_senders_into_one_receiver_over_separate_links_overlap():
    c = clocks(Topology.fully_connected(3, latency=A, bandwidth=B))
    t0, t1 = c[0].on_send(2, M), c[1].on_send(2, M)
    assert c[2].on_recv(0, M, t0) == c[2].on_recv(1, M, t1) == pytest.approx(A + M / B, rel=REL)


def test_multi_hop_route_pays_summed_latency_and_bottleneck_bandwidth():
    topo = Topology.torus2d(3, 3, latency=A, bandwidth=B)
    c = clocks(topo)
    route = topo.route(0, 4)  # (0,0) -> (1,1): 2 hops
    assert len(route.links) == 2
    assert c[4].on_recv(0, M, c[0].on_send(4, M)) == pytest.approx(2 * A + M / B, rel=REL)


def test_message_to_self_is_free():
    (c,) = clocks(Topology.fully_connected(1))
    c.advance_to(2.0)
    stamp = c.on_send(0, M)
    assert stamp == 2.0
    assert c.on_recv(0, M, stamp) == 2.0 and c.now == 2.0


@given(sizes=st.lists(st.tuples(st.integers(1, 3), st.integers(0, 10**9)), min_size=1, max_size=20))
@settings(max_examples=60, deadline=None)
def test_burst_from_one_sender_matches_cumulative_sums(sizes):
    """All sends posted at t=0: the k-th message to d arrives at α + (bytes sent to d so far)/β."""
    c = clocks(Topology.fully_connected(4, latency=A, bandwidth=B))
    stamps = [(d, n, c[0].on_send(d, n)) for d, n in sizes]
    sent = {1: 0, 2: 0, 3: 0}
    for d, n, stamp in stamps:
        sent[d] += n
        assert c[d].on_recv(0, n, stamp) == pytest.approx(A + sent[d] / B, rel=REL, abs=1e-18)
    assert c[0].now == 0.0


# --- compute ---------------------------------------------------------------------------------------

def test_compute_advances_by_the_roofline():
    dev = DeviceSpec("toy", {"float32": 1e12, "float64": 2.5e11}, memory_bandwidth=1e11, memory_capacity=1e9)
    (c,) = clocks(Topology.fully_connected(1), dev)
    assert c.compute(2e12, 1e9) == (0.0, pytest.approx(2.0, rel=REL))           # compute-bound
    start, end = c.compute(1e9, 5e11, "float64")                                  # memory-bound: 5 s
    assert start == pytest.approx(2.0, rel=REL) and end == pytest.approx(7.0, rel=REL)
    assert c.compute(1e12, 0, "float64") == (pytest.approx(7.0, rel=REL), pytest.approx(11.0, rel=REL))
    assert c.now == pytest.approx(11.0, rel=REL)


def test_advance_to_never_goes_back():
    (c,) = clocks(Topology.fully_connected(1))
    assert c.advance_to(3.0) == 3.0
    assert c.advance_to(1.0) == 3.0
    with pytest.raises(UsageError):
        c.advance_to(math.nan)


# --- collectives driven by hand --------------------------------------------------------------------

def ring_all_reduce(c: list[DeviceClock], nbytes: float, reduce_flops: float = 0.0,
                    shuffle: int | None = None) -> None:
    """2(n-1) steps: every device sends a chunk right, then receives one from its left (and reduces it)."""
    n = len(c)
    chunk = nbytes / n
    rng = random.Random(shuffle)
    for step in range(2 * (n - 1)):
        order = list(range(n))
        if shuffle is not None:
            rng.shuffle(order)  # the order devices act in must not matter
        stamps = {}
        for i in order:
            stamps[i] = c[i].on_send((i + 1) % n, chunk)
        if shuffle is not None:
            rng.shuffle(order)
        for i in order:
            left = (i - 1) % n
            c[i].on_recv(left, chunk, stamps[left])
            if step < n - 1 and reduce_flops:  # the reduce-scatter half adds the received chunk
                c[i].compute(reduce_flops, 3 * chunk)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("build", [Topology.fully_connected, Topology.ring])
def test_ring_all_reduce_matches_closed_form(n, build):
    c = clocks(build(n, latency=A, bandwidth=B))
    ring_all_reduce(c, M)
    expected = 2 * (n - 1) * (A + M / (n * B))
    assert expected == pytest.approx(analytic.ring_all_reduce(n, M, A, B), rel=REL)
    for clock in c:
        assert clock.now == pytest.approx(expected, rel=REL)


def test_ring_all_reduce_does_not_depend_on_the_order_devices_act_in():
    reference = clocks(Topology.fully_connected(8, latency=A, bandwidth=B))
    ring_all_reduce(reference, M)
    for seed in range(5):
        c = clocks(Topology.fully_connected(8, latency=A, bandwidth=B))
        ring_all_reduce(c, M, shuffle=seed)
        assert [x.now for x in c] == [x.now for x in reference]


def test_ring_all_reduce_with_reduction_compute():
    n = 4
    dev = DeviceSpec("toy", {"float32": 1e9}, memory_bandwidth=1e12, memory_capacity=1e12)
    c = clocks(Topology.fully_connected(n, latency=A, bandwidth=B), dev)
    flops = M / 4 / n  # one add per float32 element of the chunk
    ring_all_reduce(c, M, reduce_flops=flops)
    reduce_time = max(flops / 1e9, 3 * M / n / 1e12)
    expected = analytic.ring_all_reduce(n, M, A, B) + (n - 1) * reduce_time
    for clock in c:
        assert clock.now == pytest.approx(expected, rel=REL)


def binomial_broadcast(c: list[DeviceClock], nbytes: float, blocking: bool) -> None:
    """Round k: every holder r < 2^k sends to r + 2^k.  blocking: the sender waits for delivery."""
    n, k = len(c), 1
    while k < n:
        for r in range(min(k, n - k)):
            arrival = c[r + k].on_recv(r, nbytes, c[r].on_send(r + k, nbytes))
            if blocking:
                c[r].advance_to(arrival)
        k *= 2


@pytest.mark.parametrize("n", range(1, 9))
def test_binomial_broadcast_blocking_matches_ceil_log2(n):
    c = clocks(Topology.fully_connected(n, latency=A, bandwidth=B))
    binomial_broadcast(c, M, blocking=True)
    expected = math.ceil(math.log2(n)) * (A + M / B)
    assert max(x.now for x in c) == pytest.approx(expected, rel=REL)
    assert expected == pytest.approx(analytic.tree_broadcast(n, M, A, B), rel=REL)


@pytest.mark.parametrize("n", range(1, 9))
def test_binomial_broadcast_async_costs_the_tree_depth(n):
    """Asynchronous sends on separate links: rank r is reached after popcount(r) hops."""
    c = clocks(Topology.fully_connected(n, latency=A, bandwidth=B))
    binomial_broadcast(c, M, blocking=False)
    for r, clock in enumerate(c):
        assert clock.now == pytest.approx(bin(r).count("1") * (A + M / B), rel=REL)
    assert max(x.now for x in c) == pytest.approx(analytic.tree_broadcast(n, M, A, B, concurrent=True),
                                                  rel=REL)


def two_shot_all_reduce(c: list[DeviceClock], nbytes: float, blocking: bool) -> None:
    """Reduce-scatter then all-gather, device i exchanging M/n with i+s / i-s for s = 1..n-1.

    Asynchronous: each device posts its n-1 sends of a phase, then completes its n-1 receives.
    Blocking: one exchange at a time, each sender waiting until its message is delivered.
    """
    n = len(c)
    chunk = nbytes / n
    for _phase in range(2):
        if blocking:
            for s in range(1, n):
                stamps = [c[i].on_send((i + s) % n, chunk) for i in range(n)]
                arrivals = [c[(i + s) % n].on_recv(i, chunk, stamps[i]) for i in range(n)]
                for i in range(n):
                    c[i].advance_to(arrivals[i])
        else:
            stamps = {(i, (i + s) % n): c[i].on_send((i + s) % n,
                                                     chunk) for i in range(n) for s in range(1, n)}
            for i in range(n):
                for s in range(1, n):
                    src = (i - s) % n
                    c[i].on_recv(src, chunk, stamps[src, i])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("blocking", [True, False])
def test_two_shot_all_reduce_matches_closed_form(n, blocking):
    c = clocks(Topology.fully_connected(n, latency=A, bandwidth=B))
    two_shot_all_reduce(c, M, blocking)
    expected = analytic.two_shot_all_reduce(n, M, A, B, concurrent=not blocking)
    for clock in c:
        assert clock.now == pytest.approx(expected, rel=REL)


# --- state, pickling, errors -----------------------------------------------------------------------

def test_pickle_round_trip_keeps_state_and_behaviour():
    topo = Topology.hierarchical(2, 2, 1e-6, 100e9, 2e-6, 10e9)
    c = clocks(topo)
    c[0].compute()
    c[0].on_send(3, M)
    c[0].advance_to(0.25)
    back = pickle.loads(pickle.dumps(c[0]))
    assert (back.rank, back.now, back.topology, back.device) == (0, 0.25, topo, IDEAL_DEVICE)
    assert back.busy_until(0, "node0-switch") == c[0].busy_until(0, "node0-switch") > 0
    assert back.on_send(2, M) == c[0].on_send(2, M)


def test_reset():
    s, r = clocks(Topology.fully_connected(2, latency=A, bandwidth=B))
    r.on_recv(0, M, s.on_send(1, M))
    s.reset()
    r.reset()
    assert s.now == r.now == 0.0 and s.busy_until(0, 1) == r.busy_until(0, 1) == 0.0
    assert r.on_recv(0, M, s.on_send(1, M)) == pytest.approx(A + M / B, rel=REL)


@pytest.mark.parametrize("rank", [-1, 2, 1.0, True, "0"])
def test_bad_rank(rank):
    with pytest.raises(UsageError, match="rank"):
        DeviceClock(rank, Topology.fully_connected(2))


def test_numpy_sizes_are_accepted():
    s, r = clocks(Topology.fully_connected(2, latency=A, bandwidth=B))
    nbytes = np.zeros((4, 8), np.float32).nbytes
    assert r.on_recv(0, np.int64(nbytes),
                     s.on_send(1, np.int64(nbytes))) == pytest.approx(A + 128 / B, rel=REL)


def test_bad_messages():
    s, r = clocks(Topology.fully_connected(2, latency=A, bandwidth=B))
    with pytest.raises(UsageError, match="nbytes"):
        s.on_send(1, -1)
    with pytest.raises(UsageError, match="nbytes"):
        r.on_recv(0, float("nan"), 0.0)
    with pytest.raises(UsageError, match="stamp"):
        r.on_recv(0, 8, math.inf)
    with pytest.raises(MeshError):
        s.on_send(5, 8)


@pytest.mark.parametrize("n", [2, 3, 6, 8, 13])
def test_the_kept_tree_column_gives_the_replay_s_exit_clocks(n):
    """tree_all_reduce charges max_q(entry[q] + row[q]) from a kept row of the max-plus matrix;
    it must equal replaying every member's messages from the same entry clocks."""
    from virtualpar.sim.schedules import apply_delays, tree_all_reduce_column, tree_all_reduce_times

    from virtualpar import Mesh

    topo = Mesh({"x": n}).topology
    ranks = tuple(range(n))
    entry = np.random.default_rng(n).random(n).tolist()
    for nbytes in (0, 8, 1 << 16):
        want = tree_all_reduce_times(topo, ranks, entry, nbytes)
        got = [apply_delays(tree_all_reduce_column(topo, ranks, me, nbytes), entry) for me in range(n)]
        assert got == pytest.approx(want, rel=1e-13, abs=0)


@pytest.mark.parametrize("topo", ["hierarchical", "ring", "torus2d"])
def test_the_tree_row_taken_backwards_equals_the_forward_replay_of_every_unit_vector(topo):
    """tree_all_reduce_column walks one vector back through the steps (O(n log n)); the forward
    replay of all n unit vectors (O(n² log n)) must give the same matrix row, on topologies whose
    links differ and on groups that are not 0..n−1 in order (no chain: −inf in both)."""
    from virtualpar.mesh import Topology
    from virtualpar.sim.schedules import NEVER, _tree_replay, tree_all_reduce_column

    topology = {"hierarchical": Topology.hierarchical(3, 4), "ring": Topology.ring(12),
                "torus2d": Topology.torus2d(3, 4)}[topo]
    for ranks in (tuple(range(12)), tuple(range(0, 12, 2)), (11, 3, 7, 0, 5), (4, 9)):
        k = len(ranks)
        for nbytes in (0, 8, 1 << 20):
            unit = np.full((k, k), NEVER)
            np.fill_diagonal(unit, 0.0)
            forward = _tree_replay(topology, ranks, unit, nbytes)
            backward = np.array([tree_all_reduce_column(topology, ranks, me, nbytes) for me in range(k)])
            finite = np.isfinite(forward)
            assert np.array_equal(finite, np.isfinite(backward))
            np.testing.assert_allclose(backward[finite], forward[finite], rtol=1e-13, atol=0)


def test_compute_refuses_what_is_not_an_amount_of_work():
    """bytes=nan was refused as 'nbytes' (a name the caller never wrote); flops='1e9' was accepted."""
    from virtualpar import VirtualCluster

    with VirtualCluster(2) as c:
        for kw, said in ((dict(bytes=float("nan")), "bytes must be a finite number >= 0, got nan"),
                         (dict(flops="1e9"), "flops must be a finite number >= 0, got '1e9'"),
                         (dict(flops=True), "flops must be a finite number >= 0, got True"),
                         # inf made every later clock inf, and the trace's JSON invalid
                         (dict(flops=float("inf")),
                          r"device \d \(world=\d\): compute: flops must be a finite number >= 0, got inf"),
                         (dict(bytes=np.float64("inf")), "bytes must be a finite number >= 0, got")):
            with pytest.raises(UsageError, match=said):
                c.run(lambda d, kw=kw: d.compute(**kw))
        assert c.run(lambda d: d.compute(flops=np.float32(0), bytes=0)) == [0.0, 0.0]
        assert c.run(lambda d: d.compute(flops=np.array(0.0))) == [0.0, 0.0]  # a 0-d array is a number


# --- the communication stream ----------------------------------------------------------------------

def test_the_communication_stream_runs_beside_the_compute_stream():
    """Compute 1 s; then a message on the stream from t = 0.25 departs at 0.25 and arrives at
    0.25 + α + M/β, while the compute stream stays at 1; a second stream block from 0.1 starts
    where the stream ended; joining takes the later of the two."""
    s, r = clocks(Topology.fully_connected(2, latency=A, bandwidth=B), DeviceSpec("d", {"float32": 1e9},
                                                                                  math.inf, math.inf))
    s.compute(flops=1e9)
    assert s.begin_stream(0.25) == 0.25 and s.on_stream
    assert s.on_send(1, M) == 0.25
    assert s.end_stream() == 0.25 and s.now == 1.0 and not s.on_stream
    r.begin_stream(0.0)
    arrival = r.on_recv(0, M, 0.25)
    assert r.end_stream() == pytest.approx(0.25 + A + M / B, rel=REL) == arrival and r.now == 0.0
    assert r.begin_stream(0.1) == arrival  # the stream is busy until its last end
    r.end_stream()
    assert r.join_stream() == arrival and s.join_stream() == 1.0


def test_the_two_streams_keep_their_own_links():
    """A send on the stream books the link on the stream only: the compute stream's next send on
    that link departs at its own now (the streams' contention is not modelled)."""
    s, _ = clocks(Topology.fully_connected(2, latency=A, bandwidth=B))
    s.begin_stream(0.0)
    s.on_send(1, M)
    s.end_stream()
    assert s.busy_until(0, 1) == 0.0 and s.on_send(1, M) == 0.0
    s.begin_stream(0.0)
    assert s.busy_until(0, 1) == pytest.approx(M / B, rel=REL)
    s.end_stream()


def test_streams_refuse_to_nest_or_end_twice_and_reset_returns_to_compute():
    c = DeviceClock(0, Topology.fully_connected(2, latency=A, bandwidth=B))
    with pytest.raises(UsageError, match="rank 0: not on the communication stream"):
        c.end_stream()
    c.begin_stream(3.0)
    with pytest.raises(UsageError, match="already on the communication stream"):
        c.begin_stream(4.0)
    with pytest.raises(UsageError, match="still on the communication stream"):
        c.join_stream()
    c.reset()
    assert not c.on_stream and c.now == 0.0 and c.join_stream() == 0.0
    with pytest.raises(UsageError, match="got nan"):
        c.begin_stream(float("nan"))
