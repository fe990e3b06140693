"""The shared-memory reduce_scatter: chunking through a small scratch, one fence for small arrays,
bytes, every kind of group on real devices, scratch reuse across groups, the contract check, and
modelled time.

Values are checked against a single-process numpy reduction in rank order (x_0 ⊕ x_1 ⊕ … ⊕
x_{n−1}) split by ``numpy.array_split``, bit for bit; bytes against the ring's figure (each peer
reads its own piece of every member's array); modelled clocks against the ring reduce_scatter run
for real on the same topology.
"""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar import Mesh, VirtualCluster
from virtualpar.collectives import ThreadWorld, default_algorithm
from virtualpar.collectives.selection import SHM_MIN_BYTES
from virtualpar.collectives.shm_reduce_scatter import reduce_scatter
from virtualpar.errors import CollectiveMismatch, UsageError

from ._slow_reader import slow_reader_cluster
from .test_shm_all_reduce import rank_order_reduction


def pieces_of_the_sum(xs, op, dim):
    return np.array_split(rank_order_reduction(xs, op), len(xs), axis=dim)


@pytest.mark.parametrize("n", [2, 3, 5])
# items of scratch per member: rounds of 1 .. 128 items
@pytest.mark.parametrize("per_member", [1, 3, 5, 128])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "avg"])
def test_chunked_through_a_small_scratch_matches_numpy_bit_for_bit(n, per_member, op, strided):
    rng = np.random.default_rng([n, per_member])
    world = ThreadWorld(n, scratch_bytes=8 * n * per_member + 7)  # (7 bytes short of one more item each)
    for shape, dim in [((0,), 0), ((1,), 0), ((n - 1,), 0), ((7,), 0), ((17,), 0), ((3, 7), 1),
                       ((5, 2, 3), 2)]:
        xs = [rng.uniform(0.5, 1.5, size=shape) for _ in range(n)]
        before = world.bytes.copy()
        got = world.run(lambda c: reduce_scatter(c, xs[c.rank], dim, op))
        want = pieces_of_the_sum(xs, op, dim)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.tobytes() == np.ascontiguousarray(w).tobytes(), (shape, dim)
        piece = [w.nbytes for w in want]  # member r's memory is read for piece j by each peer j
        assert list((world.bytes - before).sum(axis=1)) == [sum(piece) - piece[r] for r in range(n)]


@pytest.mark.parametrize("n", [2, 3, 7])
@pytest.mark.parametrize("op", ["sum", "max", "avg"])
def test_small_arrays_ride_in_one_fence(n, op):
    """Up to fence_payload_bytes, one fence instead of two per scratch round (an 8-byte scratch
    would take two per element), with the same bits."""
    rng = np.random.default_rng([n, 9])
    world = ThreadWorld(n, scratch_bytes=8, fence_payload_bytes=256)
    for shape, dim in [((1,), 0), ((3, 5), 0), ((3, 5), 1), ((32,), 0)]:
        xs = [rng.uniform(0.5, 1.5, size=shape) * 10.0 ** rng.integers(-6, 6, size=shape) for _ in range(n)]
        got = world.run(lambda c: (reduce_scatter(c, xs[c.rank], dim, op), c._fences))
        want = pieces_of_the_sum(xs, op, dim)
        assert [g.tobytes() for g, _ in got] == [np.ascontiguousarray(w).tobytes() for w in want]
        assert {fences for _, fences in got} == {1}


def _in_groups(dev, shapes):
    rng = np.random.default_rng(dev.rank)
    out = []
    for group in (None, "b", ("a", "c")):  # ("a", "c"): members 0, 1, 4, 5 — not evenly spaced
        for shape, dim in shapes:
            x = rng.uniform(size=shape) * 10.0 ** rng.integers(-6, 6, size=shape)
            got = dev.reduce_scatter(x, dim=dim, group=group, algorithm="shm")
            out.append((dev.mesh.group_of(dev.rank, dev.mesh.axes(group)), x, got))
    return out


def test_on_real_devices_in_every_kind_of_group(strided):
    """Through the fence slots (8 B .. 8 KiB) and through the scratch (up to 512 KiB, uneven
    pieces), along dim 0 and 1, in the whole mesh, one axis, and two axes whose members are not
    evenly spaced; bit for bit in rank order, and the bytes the ring would move."""
    shapes = [((3,), 0), ((4, 9), 1), ((1024,), 0), ((1027,), 0), ((3, 1001), 1), ((65539,), 0)]
    with VirtualCluster(Mesh({"a": 2, "b": 2, "c": 2}), trace=False) as cluster:
        runs = cluster.run(_in_groups, shapes)
        sent = cluster.stats().bytes.sum(axis=1)
    expected = [0] * 8
    for rank, results in enumerate(runs):
        for i, (ranks, x, got) in enumerate(results):
            shape, dim = shapes[i % len(shapes)]
            want = pieces_of_the_sum([runs[m][i][1] for m in ranks], "sum", dim)[ranks.index(rank)]
            assert got.shape == want.shape and got.tobytes() == np.ascontiguousarray(want).tobytes(), (
                rank,
                ranks,
                shape,
            )
            expected[rank] += x.nbytes - want.nbytes  # every peer reads its own piece of ours
    assert list(sent) == expected


def _row_then_world(dev, n):
    row = dev.reduce_scatter(np.full(n, 1.0 + dev.rank), group="b", algorithm="shm")
    world = dev.reduce_scatter(np.full(n, 100.0 * (dev.rank + 1)), algorithm="shm")
    return row, world


def test_a_slow_reader_in_one_group_keeps_its_peer_from_refilling_the_scratch_in_another(monkeypatch):
    """Device 0 dawdles after the row call's first fence, before reducing its piece (the first
    half) out of device 1's scratch.  Device 1 has its own piece by then and moves on to the
    whole-mesh call, whose first chunk refills that scratch before any fence (all but device 1's
    quarter, so the first half too): the row call's last fence must hold it back, or device 0
    adds device 1's mesh-wide input instead of its row input."""
    n = 2000  # 16 KB: past the fence slots
    # every member's input is in its scratch
    with slow_reader_cluster(monkeypatch, fence_number=1) as cluster:
        got = cluster.run(_row_then_world, n)
    for rank, (row, world) in enumerate(got):
        partner = rank ^ 1  # row groups {0, 1}, {2, 3}
        np.testing.assert_array_equal(row, np.full(n // 2, 2.0 + rank + partner))
        np.testing.assert_array_equal(world, np.full(n // 4, 1000.0))


def _mismatched(dev):
    return dev.reduce_scatter(np.ones(3000 + (dev.rank == 2)), algorithm="shm")


def test_a_member_with_another_shape_is_named_at_the_first_fence():
    with VirtualCluster(4, trace=False) as cluster:
        with pytest.raises(CollectiveMismatch, match=r"reduce_scatter.*shape=\(3001,\)"):
            cluster.run(_mismatched)
        # and the cluster goes on
        ok = cluster.run(lambda dev: dev.reduce_scatter(np.ones(8), algorithm="shm"))
    assert [o.tolist() for o in ok] == [[4.0, 4.0]] * 4


def _skewed(dev, algorithm, count):
    dev.compute(flops=1e9 * (dev.rank + 1))  # members enter at different modelled times
    got = dev.reduce_scatter(np.arange(count, dtype=np.float32) + dev.rank, algorithm=algorithm)
    return dev.clock, got.tolist()


@pytest.mark.parametrize("hardware", ["h100-node", "h100-cluster"])
@pytest.mark.parametrize("mesh", [{"node": 2, "gpu": 2}, {"node": 2, "gpu": 3}], ids=["2x2", "2x3"])
def test_shm_costs_exactly_what_the_ring_costs_on_the_modelled_hardware(hardware, mesh):
    """Fresh clusters (clocks at 0), members entering at different times, pieces of unequal
    sizes: the same clocks and pieces as the ring reduce_scatter run for real."""
    for count in (0, 5, 1001, 1 << 16):
        runs = {}
        for algorithm in ("ring", "shm"):
            with VirtualCluster(Mesh(mesh), hardware=hardware, trace=False) as cluster:
                runs[algorithm] = cluster.run(_skewed, algorithm, count)
        # small integers: exact in any order
        assert [p for _, p in runs["shm"]] == [p for _, p in runs["ring"]]
        assert [t for t, _ in runs["shm"]] == pytest.approx([t for t, _ in runs["ring"]], rel=1e-12,
                                                            abs=0), count
        assert runs["shm"][0][0] > 0



def test_the_default_is_shm_but_for_small_pairs_and_without_scratch_the_ring():
    assert default_algorithm("reduce_scatter", 8, 3, shared_memory=True) == "shm"
    assert default_algorithm("reduce_scatter", 8, 64, shared_memory=True) == "shm"
    assert default_algorithm("reduce_scatter", SHM_MIN_BYTES, 2, shared_memory=True) == "shm"
    assert default_algorithm("reduce_scatter", SHM_MIN_BYTES - 1, 2, shared_memory=True) == "ring"
    assert default_algorithm("reduce_scatter", 1 << 20, 8, shared_memory=False) == "ring"
    assert default_algorithm("reduce_scatter", 1 << 20, 1, shared_memory=True) == "ring"
    with VirtualCluster(4, trace=True) as cluster:
        cluster.run(lambda dev: dev.reduce_scatter(np.ones(8)))
        assert {dict(e.args)["algorithm"] for e in cluster.trace().events if e.name == "reduce_scatter"} == {
            "shm"
        }
    with VirtualCluster(4, scratch_bytes=0, trace=True) as cluster:
        got = cluster.run(lambda dev: dev.reduce_scatter(np.ones(8)))
        assert {dict(e.args)["algorithm"] for e in cluster.trace().events if e.name == "reduce_scatter"} == {
            "ring"
        }
    assert [g.tolist() for g in got] == [[4.0, 4.0]] * 4


def test_a_scratch_smaller_than_one_item_is_a_usage_error_naming_the_way_out():
    world = ThreadWorld(2, scratch_bytes=4)
    with pytest.raises(UsageError,
                       match=r"reduce_scatter algorithm 'shm' needs scratch memory of at least one float64 "
                                         r"element per member \(2 here\) per device, but the cluster has "
                                         r"scratch_bytes=4; .* algorithm='ring'"):
        world.run(lambda c: reduce_scatter(c, np.ones(4)))


def test_every_round_carries_part_of_every_piece():
    """An array 3 times the scratch: 3 rounds, and every member reduces part of its piece in each
    (consecutive chunks of the array left one member working per round once the array was n times
    the scratch), fencing twice per round."""
    from virtualpar.collectives.shm_pieces import piece_rounds, round_count

    n, q = 4, 5  # 5 items of each piece per round
    world = ThreadWorld(n, scratch_bytes=8 * n * q)
    e = [0, 15, 30, 45, 60]

    def body(c):
        source = np.arange(60.0) + 100 * c.rank
        parts = [(a, b) for a, b, _ in piece_rounds(c, source, e, "reduce_scatter", "ring")]
        return parts, round_count(c, e, 8), c._fences

    for parts, rounds, fences in world.run(body):
        assert parts == [(0, 5), (5, 10), (10, 15)] and rounds == 3 and fences == 6
