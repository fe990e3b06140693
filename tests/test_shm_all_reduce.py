"""The shared-memory all_reduce: chunking through a small scratch, fences, bytes, default choice, modelled
time.

Values are checked against a single-process numpy reduction in the algorithm's fixed rank order
(x_0 ⊕ x_1 ⊕ … ⊕ x_{n−1}), bit for bit; the modelled clocks against the ring algorithm run for
real on the same topology, and against the closed form 2(n−1)(α + M/(nβ)).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from virtualpar import Mesh, VirtualCluster
from virtualpar.collectives import REDUCE_OPS, ThreadWorld, default_algorithm, shm
from virtualpar.collectives.selection import SHM_MIN_BYTES
from virtualpar.collectives.shm import RING_MIN_BYTES
from virtualpar.collectives.shm_copy import COPY_MIN_ROOM
from virtualpar.errors import CollectiveTimeout, UsageError
from virtualpar.mesh import Topology
from virtualpar.sim import analytic
from virtualpar.sim.schedules import ring_all_reduce_times

from ._slow_reader import slow_reader_cluster


def rank_order_reduction(xs: list[np.ndarray], op: str) -> np.ndarray:
    """x_0 ⊕ x_1 ⊕ … in rank order, the order the shm algorithm promises (so bits must match)."""
    ufunc = REDUCE_OPS[op].ufunc
    acc = functools.reduce(lambda a, b: ufunc(a, b), xs[1:], xs[0].copy())
    return acc / len(xs) if op == "avg" else acc


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("scratch_bytes", [8, 24, 40, 4096])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "avg"])
def test_chunked_through_a_small_scratch_matches_numpy_bit_for_bit(n, scratch_bytes, op, strided):
    rng = np.random.default_rng([n, scratch_bytes])
    world = ThreadWorld(n, scratch_bytes=scratch_bytes)
    for size in (0, 1, n - 1, 7, 17):
        xs = [rng.uniform(0.5, 1.5, size=size) for _ in range(n)]
        before = world.bytes.copy()
        got = world.run(lambda c: shm.all_reduce(c, xs[c.rank], op))
        want = rank_order_reduction(xs, op)
        for g in got:
            assert g.tobytes() == want.tobytes()
        # bytes, per chunk of `capacity` elements: member r's memory is read for (m - |s_r|) + (n-1)|s_r|
        capacity = scratch_bytes // 8
        expected = [0] * n
        for start in range(0, size, capacity):
            b = shm.split_bounds(min(capacity, size - start), n)
            for r in range(n):
                s_r = b[r + 1] - b[r]
                expected[r] += 8 * ((b[n] - s_r) + (n - 1) * s_r)
        assert list((world.bytes - before).sum(axis=1)) == expected


@pytest.mark.parametrize("n", [2, 3, 7])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "avg"])
def test_small_arrays_ride_in_one_fence_and_match_numpy_bit_for_bit(n, op):
    """Arrays up to fence_payload_bytes take one fence, not three, with the same rank-order bits
    (m = 1 included: numpy would sum a single column pairwise) and (n−1)·M bytes read per member."""
    rng = np.random.default_rng([n, 7])
    world = ThreadWorld(n, scratch_bytes=8, fence_payload_bytes=256)
    fences = []
    for shape in [(1,), (2,), (3, 5), (32,)]:  # 8 .. 256 bytes
        xs = [rng.uniform(0.5, 1.5, size=shape) * 10.0 ** rng.integers(-6, 6, size=shape) for _ in range(n)]
        before = world.bytes.copy()

        def body(c):
            out = shm.all_reduce(c, xs[c.rank], op)
            return out, c._fences

        got = world.run(body)
        want = rank_order_reduction(xs, op)
        assert all(g.tobytes() == want.tobytes() and g.shape == shape for g, _ in got)
        assert list((world.bytes - before).sum(axis=1)) == [8 * want.size * (n - 1)] * n
        fences.append(got[0][1])
    assert fences == [1, 1, 1, 1]  # the 8-byte scratch would have taken 3 fences per element


def test_split_bounds_is_array_split():
    for m in range(0, 12):
        for n in range(1, 6):
            b = shm.split_bounds(m, n)
            assert [b[i + 1] - b[i] for i in range(n)] == [len(p) for p in np.array_split(np.arange(m), n)]


def test_scratch_smaller_than_one_element_is_a_usage_error():
    with pytest.raises(UsageError, match="scratch_bytes=4.*algorithm='ring'"):
        ThreadWorld(2, scratch_bytes=4).run(lambda c: shm.all_reduce(c, np.zeros(3), "sum"))


def test_a_failing_member_aborts_the_others_waiting_in_a_fence():
    def body(comm):
        if comm.rank == 1:
            raise KeyError("rank one failed before the fence")
        return shm.all_reduce(comm, np.ones(8), "sum")

    with pytest.raises(KeyError, match="rank one failed"):
        ThreadWorld(3, timeout=30).run(body)


def test_a_missing_member_times_out_in_the_fence():
    world = ThreadWorld(2, timeout=0.2)
    with pytest.raises(CollectiveTimeout, match="fence"):
        world.run(lambda c: shm.all_reduce(c, np.ones(8), "sum") if c.rank == 0 else None)
    assert world.run(lambda c: shm.all_reduce(c, np.ones(2), "sum")[0]) == [2.0, 2.0]  # reusable after


def test_default_algorithm_by_size_group_and_memory():
    edge = SHM_MIN_BYTES
    assert default_algorithm("all_reduce", edge, 4, shared_memory=True) == "shm"
    # charged as the tree when small
    assert default_algorithm("all_reduce", 8, 3, shared_memory=True) == "shm"
    assert default_algorithm("all_reduce", 8, 2, shared_memory=True) == "shm"  # pairs too, at every size
    assert default_algorithm("all_reduce", 8, 2, shared_memory=False) == "tree"
    assert default_algorithm("all_reduce", edge, 4, shared_memory=False) == "ring"
    assert default_algorithm("all_reduce", edge - 1, 4, shared_memory=False) == "tree"
    assert default_algorithm("all_reduce", edge, 1, shared_memory=True) == "ring"
    # any size: pieces may differ
    assert default_algorithm("all_gather", edge, 4, shared_memory=True) == "shm"
    assert default_algorithm("all_gather", 8, 2, shared_memory=True) == "shm"
    assert default_algorithm("all_gather", edge, 4, shared_memory=False) == "ring"
    assert default_algorithm("all_gather", edge, 1, shared_memory=True) == "ring"
    assert default_algorithm("broadcast", edge, 4, shared_memory=True) == "shm"
    assert default_algorithm("broadcast", edge, 4, shared_memory=False) == "tree"
    assert default_algorithm("barrier", 0, 4, shared_memory=True) == "shm"
    assert default_algorithm("barrier", 0, 4, shared_memory=False) == "direct"


# -- the modelled clock ------------------------------------------------------------------------------
def test_ring_schedule_is_the_closed_form_on_a_uniform_topology():
    a, b = 2e-6, 450e9
    for n in (2, 3, 4, 8):
        topo = Topology.fully_connected(n, latency=a, bandwidth=b)
        M = 8 * 1024 * n
        times = ring_all_reduce_times(topo, list(range(n)), [1.0] * n, [M // n] * n)
        assert times == pytest.approx([1.0 + analytic.ring_all_reduce(n, M, a, b)] * n, rel=1e-12, abs=0)


def test_ring_schedule_waits_for_the_latest_member():
    topo = Topology.fully_connected(2, latency=1.0, bandwidth=1.0)  # a message of m bytes: 1 + m s
    # step 1: member 0 leaves at max(0 + 1 + 2, 10 + 1 + 2) = 13; member 1 at max(10 + 3, 0 + 3) = 13
    assert ring_all_reduce_times(topo, [0, 1], [0.0, 10.0], [2, 2]) == [16.0, 16.0]


def _skewed_all_reduce(dev, algorithm, n):
    dev.compute(flops=1e9 * (dev.rank + 1))  # members enter at different modelled times
    x = np.arange(n, dtype=np.float32) + dev.rank
    y = dev.all_reduce(x, algorithm=algorithm)
    return dev.clock, float(y.sum())


@pytest.mark.parametrize("hardware", ["h100-node", "h100-cluster"])
@pytest.mark.parametrize("mesh", [{"node": 2, "gpu": 2}, {"node": 2, "gpu": 3}], ids=["2x2", "2x3"])
def test_shm_costs_exactly_what_the_ring_or_tree_costs_on_the_modelled_hardware(hardware, mesh):
    """Fresh clusters (clocks at 0), members entering at different times: the same clocks and sums
    as the ring from RING_MIN_BYTES and as the recursive-doubling tree below it (6 members: the
    tree's fold and unfold too)."""
    mesh = Mesh(mesh)
    sizes = (0, 5, 1000, 1 << 16)  # float32: 0 B, 20 B, 4000 B, 256 KiB
    for n in sizes:
        runs = {}
        for algorithm in ("ring" if 4 * n >= RING_MIN_BYTES else "tree", "shm"):
            with VirtualCluster(mesh, hardware=hardware, trace=False) as cluster:
                runs[algorithm] = cluster.run(_skewed_all_reduce, algorithm, n)
        shm_run = runs.pop("shm")
        (ref,) = runs.values()
        assert [s for _, s in shm_run] == pytest.approx([s for _, s in ref], rel=1e-6)
        assert [t for t, _ in shm_run] == pytest.approx([t for t, _ in ref], rel=1e-12, abs=0), n
        assert shm_run[0][0] > 0


def _all_reduce_own(dev, xs, algorithm):
    return dev.all_reduce(xs[dev.rank], algorithm=algorithm)


def test_shm_bytes_and_results_on_real_devices_with_a_tiny_scratch(strided):
    with VirtualCluster(4, scratch_bytes=48, trace=False) as cluster:  # 6 float64 per chunk
        # 9.6 KB: more than a fence carries (Layout.fence_payload_bytes), so the scratch path runs
        xs = [np.random.default_rng(r).uniform(size=(40, 30)) for r in range(4)]
        cluster.reset_stats()
        got = cluster.run(_all_reduce_own, xs, "shm")
        sent = cluster.stats().bytes.sum(axis=1)
    want = rank_order_reduction(xs, "sum")
    assert all(g.tobytes() == want.tobytes() for g in got)
    expected = [0] * 4
    for start in range(0, 1200, 6):
        b = shm.split_bounds(min(6, 1200 - start), 4)
        for r in range(4):
            s_r = b[r + 1] - b[r]
            expected[r] += 8 * ((b[4] - s_r) + 3 * s_r)
    assert list(sent) == expected


def test_scratch_regions_are_page_aligned_disjoint_and_after_the_rings():
    from virtualpar.transport.shm import Layout

    layout = Layout(3, 1 << 16, scratch_bytes=5000)
    rings_end = layout.ring_offset(3, 2) + layout.ring_bytes  # the last ring (host -> device 2)
    offsets = [layout.scratch_offset(r) for r in range(3)]
    assert offsets[0] >= rings_end and all(o % 4096 == 0 for o in offsets)
    assert all(b - a >= 5000 for a, b in zip(offsets, offsets[1:]))
    assert layout.total_bytes >= offsets[-1] + 5000
    # no scratch: no bytes
    assert Layout(3, 1 << 16).payloads_offset == Layout(3, 1 << 16, 0).scratch_data_offset
    with pytest.raises(ValueError, match="no scratch region"):
        layout.scratch_offset(3)  # the host has none


# -- failures: no hang, a clear error, and a cluster that still adds up afterwards --------------------
def _shm_twice(dev, skip_rank=None):
    out = []
    for k in range(2):
        if dev.rank == skip_rank and k == 1:
            continue
        out.append(dev.all_reduce(np.full(1000, float(dev.rank + k)), algorithm="shm"))
    return out


def test_a_device_failing_before_the_fence_aborts_the_others_and_the_cluster_recovers():
    from virtualpar.errors import InjectedFault

    with VirtualCluster(3, check_collectives=False, timeout=20.0, trace=False) as cluster:
        cluster.inject(2, at_op=2, action="raise")  # its second shm all_reduce never arrives
        with pytest.raises(InjectedFault, match=r"device 2 .*op #2"):
            cluster.run(_shm_twice)
        # the others had arrived at a fence: the reset zeroed the counts, so the next calls pair up
        for got in cluster.run(_shm_twice):
            np.testing.assert_array_equal(got[0], np.full(1000, 3.0))
            np.testing.assert_array_equal(got[1], np.full(1000, 6.0))


def test_a_device_skipping_the_shm_all_reduce_is_named_by_the_timeout():
    with VirtualCluster(3, check_collectives=False, timeout=0.5, trace=False,
                        detect_deadlocks=False) as cluster:
        with pytest.raises(CollectiveTimeout) as info:
            cluster.run(_shm_twice, 1)
        assert info.value.missing == [1] and "all_reduce #2" in str(info.value)
        assert [len(r) for r in cluster.run(_shm_twice)] == [2, 2, 2]


def _default_all_reduce(dev, n):
    return float(dev.all_reduce(np.ones(n))[0])


def test_without_scratch_the_default_falls_back_to_messages():
    """Without scratch, or with less than COPY_MIN_ROOM of it (where rounds of three fences over a
    few items each cost far more than the ring), the default all_reduce sends messages."""
    big = SHM_MIN_BYTES // 8  # float64 elements: large enough for shm by size
    for scratch, expected in ((0, "ring"), (8, "ring"), (COPY_MIN_ROOM - 1, "ring"), (COPY_MIN_ROOM, "shm")):
        with VirtualCluster(2, scratch_bytes=scratch) as cluster:
            assert cluster.run(_default_all_reduce, big) == [2.0, 2.0]
            ran = [dict(e.args)["algorithm"] for e in cluster.trace().events if e.kind == "collective"]
        assert ran == [expected, expected]
    with pytest.raises(UsageError, match="scratch_bytes must be an int >= 0"):
        VirtualCluster(2, scratch_bytes=-1)
    # sizes the first send would have refused (ring_bytes), or nothing would have (abort_grace)
    for kwargs, message in (({"ring_bytes": 100},
                             "ring_bytes must be an int multiple of 8 and at least 4096"),
                            ({"ring_bytes": 0}, "ring_bytes must be"),
                            ({"abort_grace": -1}, "abort_grace must be")):
        with pytest.raises(UsageError, match=message):
            VirtualCluster(2, **kwargs)


# -- scratch reuse across groups: refilled only after every reader is done --------------------------
def _row_then(dev, n, then):
    row = dev.all_reduce(np.full(n, 1.0 + dev.rank), group="b", algorithm="shm")
    nxt = dev.all_reduce(np.full(n, 100.0 * (dev.rank + 1)), group=then, algorithm="shm")
    return row, nxt


@pytest.mark.parametrize("then", ["a", "b"], ids=["column next", "row again"])
def test_a_slow_reader_keeps_the_first_member_from_refilling_its_scratch(monkeypatch, then):
    """Device 1 dawdles after the row all_reduce's second fence, before copying the reduced chunk
    out of the row's first member's scratch (device 0's).  Device 0 moves on — to its column group
    {0, 2}, or to the row's next all_reduce — whose first chunk refills that scratch: the row
    call's last fence (a release: only device 0 waits for it, before that refill) must hold it
    back until device 1 is done, or device 1 copies out device 0's next input instead of the row
    sums.  Device 1 returns from its release at once, so the column case checks that device 0
    waits in a call of another group for a release of the row's."""
    n = 2000  # 16 KB: past the fence slots (1000 items rode in one fence, and this test passed without
    # the last fence); the row all_reduce's second fence publishes its reduced slices
    with slow_reader_cluster(monkeypatch, fence_number=2, rank=1) as cluster:
        got = cluster.run(_row_then, n, then)
    for rank, (row, nxt) in enumerate(got):
        partner = rank ^ 1 if then == "b" else (rank + 2) % 4  # rows {0, 1}, {2, 3}; columns {0, 2}, {1, 3}
        np.testing.assert_array_equal(row, np.full(n, 2.0 + rank + (rank ^ 1)))
        np.testing.assert_array_equal(nxt, np.full(n, 100.0 * (rank + 1) + 100.0 * (partner + 1)))


def _row_then_fail(dev, n):
    dev.all_reduce(np.full(n, 1.0), group="b", algorithm="shm")
    if dev.rank == 3:
        raise ValueError("device 3 fails after its all_reduce")


def test_a_reset_forgets_the_release_the_first_member_awaited(monkeypatch):
    """Device 0 leaves the row all_reduce still owed device 1's release (device 1 dawdles); device 3
    then fails, and the cluster is reset, its arrival words zeroed.  The next all_reduce must not
    wait for a release numbered before the reset (it would wait for the op's whole timeout)."""
    with slow_reader_cluster(monkeypatch, fence_number=2, rank=1) as cluster:
        with pytest.raises(Exception, match="device 3 fails after its all_reduce"):
            cluster.run(_row_then_fail, 2000)
        # (without the reset forgetting it: RunTimeout, not a wait of the op timeout)
        cluster.run_timeout = 10.0
        got = cluster.run(_row_then, 2000, "b")
    for rank, (row, nxt) in enumerate(got):
        np.testing.assert_array_equal(row, np.full(2000, 2.0 + rank + (rank ^ 1)))


def _small_in_groups(dev, shapes):
    rng = np.random.default_rng(dev.rank)
    out = []
    for group in (None, "b", ("a", "c")):  # ("a", "c"): members 0, 1, 4, 5 — not evenly spaced
        for shape in shapes:
            x = rng.uniform(size=shape) * 10.0 ** rng.integers(-6, 6, size=shape)
            out.append((dev.mesh.group_of(dev.rank, dev.mesh.axes(group)), x, dev.all_reduce(x, group=group)))
    return out


def test_one_fence_all_reduce_on_real_devices_in_every_kind_of_group():
    """Small arrays through the fence slots on devices: whole mesh, one axis, and two axes whose
    members are not evenly spaced (the slots are gathered, not viewed), bit for bit in rank order."""
    with VirtualCluster(Mesh({"a": 2, "b": 2, "c": 2}), trace=False) as cluster:
        shapes = [(1,), (3,), (4, 4), (1024,)]  # 8 B .. 8 KiB
        runs = cluster.run(_small_in_groups, shapes)
        assert cluster.layout.fence_payload_bytes >= 8192
    k = 0
    for rank, results in enumerate(runs):
        for i, (ranks, _, got) in enumerate(results):
            want = rank_order_reduction([runs[m][i][1] for m in ranks], "sum")
            assert got.tobytes() == want.tobytes(), (rank, ranks, got.shape)
            k += 1
    assert k == 8 * 3 * 4


def test_scratch_all_reduce_on_real_devices_in_every_kind_of_group(strided):
    """Past the fence slots, through the scratch, in groups whose members are evenly spaced (the
    whole mesh, one axis: strided rows when ``strided``) and not (("a", "c"): always member by
    member); bit for bit in rank order, with slices of one item and uneven remainders."""
    with VirtualCluster(Mesh({"a": 2, "b": 2, "c": 2}), trace=False) as cluster:
        shapes = [(1025,), (1027,), (3, 1001), (65539,)]  # 8200 B .. 512 KiB, none a multiple of 8 items
        runs = cluster.run(_small_in_groups, shapes)
    for rank, results in enumerate(runs):
        for i, (ranks, _, got) in enumerate(results):
            want = rank_order_reduction([runs[m][i][1] for m in ranks], "sum")
            assert got.tobytes() == want.tobytes(), (rank, ranks, got.shape)


@pytest.mark.parametrize("n", [8, 13])
def test_one_numpy_reduction_over_the_rows_still_adds_them_in_rank_order(n, strided):
    """The strided-rows path reduces all members' slices in one numpy call, which must add them in
    rank order as the member-by-member loop does — also for slices of one item (an inner axis,
    which numpy would sum pairwise).  The values span 16 orders of magnitude, so another order shows."""
    rng = np.random.default_rng(n)
    world = ThreadWorld(n, scratch_bytes=4096)
    reordered = 0
    for size in (n, n + 1, 2 * n - 1, 3 * n + 2, 200):
        xs = [rng.standard_normal(size) * 10.0 ** rng.integers(-8, 9, size) for _ in range(n)]
        got = world.run(lambda c: shm.all_reduce(c, xs[c.rank], "sum"))
        want = rank_order_reduction(xs, "sum")
        assert all(g.tobytes() == want.tobytes() for g in got), size
        reordered += np.sum(np.add.reduce(np.stack(xs[::-1]), axis=0) != want)
    assert reordered > 0  # the test can tell the orders apart


def _oversized_fence_payload(dev):
    import time as _time

    from virtualpar.runtime.collective_spec import CollectiveSpec
    from virtualpar.runtime.group_comm import GroupComm

    spec = CollectiveSpec.build(dev._core, "barrier", None, dev._group(None), None, {})
    comm = GroupComm(dev._core, spec, _time.monotonic() + 5, None, None)
    with pytest.raises(UsageError, match=r"carries at most 8192 bytes per member, not 8200"):
        comm.fence_exchange(np.zeros(comm.fence_payload_bytes // 8 + 1))
    return comm.fence_payload_bytes


def test_a_fence_refuses_a_payload_larger_than_its_slot():
    """The slot is fixed per member; a larger array gets an error naming both sizes, on real
    devices as in ThreadWorld, instead of spilling into the next member's slot."""
    with VirtualCluster(2, trace=False) as cluster:
        assert cluster.run(_oversized_fence_payload) == [8192, 8192]
    with pytest.raises(UsageError, match="at most 16 bytes"):
        ThreadWorld(2, fence_payload_bytes=16).run(lambda c: c.fence_exchange(np.zeros(3)))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.bool_])
def test_small_integers_wrap_around_as_numpy_does_in_every_algorithm_and_size(dtype):
    """A sum or product that overflows a small integer type wraps around, as numpy's own arithmetic
    (and MPI's, torch's) does.  A single element took a path that accumulated in int64 and then
    raised OverflowError storing 400 into an int8 — only at one element, only without algorithm=."""
    def reduce_all(dev, size):
        x = np.full(size, 100 if dtype is not np.bool_ else dev.rank % 2, dtype)
        return {(algo, op): dev.all_reduce(x, algorithm=algo, op=op)
                for algo in (None, "shm", "ring", "tree", "direct") for op in ("sum", "prod")}

    with VirtualCluster(4, timeout=30) as cluster:
        for size in (1, 2, 5000):
            xs = [np.full(size, 100 if dtype is not np.bool_ else r % 2, dtype) for r in range(4)]
            for got in cluster.run(reduce_all, size):
                for (algo, op), value in got.items():
                    want = rank_order_reduction(xs, op)
                    assert value.dtype == np.dtype(dtype), (algo, op, size)
                    np.testing.assert_array_equal(value, want, err_msg=f"{algo} {op} size {size}")
