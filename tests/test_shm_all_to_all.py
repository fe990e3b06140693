"""The shared-memory all_to_all: chunking through a small scratch, every kind of group on real
devices, bytes, scratch reuse across groups, the contract check, and modelled time.

Results are checked against the numpy oracle (``reference.all_to_all``: split, route, concatenate)
exactly; bytes against the pairwise exchange's figures (each peer reads its own piece of every
member's array); modelled clocks against the exchange (``direct.all_to_all``) run for real on the
same topology.
"""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar import Mesh, VirtualCluster
from virtualpar.collectives import ThreadWorld, default_algorithm, reference
from virtualpar.collectives.shm_all_to_all import all_to_all
from virtualpar.errors import CollectiveMismatch, UsageError

from ._slow_reader import slow_reader_cluster

CASES = [((0,), 0, 0), ((1,), 0, 0), ((7,), 0, 0), ((17, 3), 0, 1), ((3, 17), 1, 0), ((4, 5, 6), 2, 1)]


@pytest.mark.parametrize("n", [2, 3, 5])
# items of scratch per member: rounds of 1 .. 128 items
@pytest.mark.parametrize("per_member", [1, 3, 5, 128])
def test_chunked_through_a_small_scratch_matches_numpy(n, per_member, strided):
    rng = np.random.default_rng([n, per_member])
    world = ThreadWorld(n, scratch_bytes=8 * n * per_member + 7)  # (7 bytes short of one more item each)
    for shape, split_dim, concat_dim in CASES:
        xs = [rng.standard_normal(shape) for _ in range(n)]
        before = world.bytes.copy()
        got = world.run(lambda c: all_to_all(c, xs[c.rank], split_dim, concat_dim))
        want = reference.all_to_all(xs, split_dim, concat_dim)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.tobytes() == w.tobytes(), (shape, split_dim, concat_dim)
        piece = [p.nbytes for p in np.array_split(xs[0], n, axis=split_dim)]
        assert list((world.bytes - before).sum(axis=1)) == [xs[0].nbytes - piece[r] for r in range(n)]


def _in_groups(dev, cases):
    rng = np.random.default_rng(dev.rank)
    out = []
    for group in (None, "b", ("a", "c")):  # ("a", "c"): members 0, 1, 4, 5 — not evenly spaced
        for shape, split_dim, concat_dim in cases:
            x = rng.standard_normal(shape)
            got = dev.all_to_all(x, split_dim=split_dim, concat_dim=concat_dim, group=group, algorithm="shm")
            out.append((dev.mesh.group_of(dev.rank, dev.mesh.axes(group)), x, got))
    return out


def test_on_real_devices_in_every_kind_of_group(strided):
    """Small and large (past the scratch's 4 MiB: two rounds), split and concatenated along either
    dim, in the whole mesh, one axis, and two axes whose members are not evenly spaced."""
    cases = [((3,), 0, 0), ((9, 4), 1, 0), ((1027, 3), 0, 1), ((8, 65539), 1, 1)]
    with VirtualCluster(Mesh({"a": 2, "b": 2, "c": 2}), trace=False) as cluster:
        runs = cluster.run(_in_groups, cases)
        sent = cluster.stats().bytes.sum(axis=1)
    expected = [0] * 8
    for rank, results in enumerate(runs):
        for i, (ranks, x, got) in enumerate(results):
            shape, split_dim, concat_dim = cases[i % len(cases)]
            want = reference.all_to_all([runs[m][i][1] for m in ranks], split_dim,
                                        concat_dim)[ranks.index(rank)]
            assert got.shape == want.shape and got.tobytes() == want.tobytes(), (rank, ranks, shape)
            expected[rank] += x.nbytes - np.array_split(x, len(ranks),
                                                        axis=split_dim)[ranks.index(rank)].nbytes
    assert list(sent) == expected


def _row_then_world(dev, n):
    row = dev.all_to_all(np.full(n, 1.0 + dev.rank), group="b", algorithm="shm")
    world = dev.all_to_all(np.full(n, 100.0 * (dev.rank + 1)), algorithm="shm")
    return row, world


def test_a_slow_reader_in_one_group_keeps_its_peer_from_refilling_the_scratch_in_another(monkeypatch):
    """Device 0 dawdles after the row call's first fence, before copying its piece (the first half)
    out of device 1's scratch; device 1 moves on to the whole-mesh call, which refills that scratch
    before any fence: the row call's last fence must hold it back."""
    n = 2000
    # every member's array is in its scratch
    with slow_reader_cluster(monkeypatch, fence_number=1) as cluster:
        got = cluster.run(_row_then_world, n)
    for rank, (row, world) in enumerate(got):
        pair = (rank & ~1, rank | 1)  # row groups {0, 1}, {2, 3}
        np.testing.assert_array_equal(row, np.repeat([1.0 + p for p in pair], n // 2))
        np.testing.assert_array_equal(world, np.repeat([100.0 * (p + 1) for p in range(4)], n // 4))


def _mismatched(dev):
    return dev.all_to_all(np.ones((8, 3 + (dev.rank == 1))), algorithm="shm")


def test_a_member_with_another_shape_is_named_at_the_first_fence():
    with VirtualCluster(4, trace=False) as cluster:
        with pytest.raises(CollectiveMismatch, match=r"all_to_all.*shape=\(8, 4\)"):
            cluster.run(_mismatched)
        ok = cluster.run(lambda dev: dev.all_to_all(np.full(4, float(dev.rank)), algorithm="shm"))
    assert [o.tolist() for o in ok] == [[0.0, 1.0, 2.0, 3.0]] * 4


def _skewed(dev, algorithm, count):
    dev.compute(flops=1e9 * (dev.rank + 1))  # members enter at different modelled times
    got = dev.all_to_all(np.arange(count, dtype=np.float32) + dev.rank, algorithm=algorithm)
    return dev.clock, got.tolist()


@pytest.mark.parametrize("hardware", ["h100-node", "h100-cluster"])
@pytest.mark.parametrize("mesh", [{"node": 2, "gpu": 2}, {"node": 2, "gpu": 3}], ids=["2x2", "2x3"])
def test_shm_costs_exactly_what_the_pairwise_exchange_costs_on_the_modelled_hardware(hardware, mesh):
    """Fresh clusters (clocks at 0), members entering at different times, pieces of unequal sizes:
    the same clocks and results as the exchange run for real."""
    for count in (0, 5, 1001, 1 << 16):
        runs = {}
        for algorithm in ("direct", "shm"):
            with VirtualCluster(Mesh(mesh), hardware=hardware, trace=False) as cluster:
                runs[algorithm] = cluster.run(_skewed, algorithm, count)
        assert [p for _, p in runs["shm"]] == [p for _, p in runs["direct"]]
        assert [t for t, _ in runs["shm"]] == pytest.approx([t for t, _ in runs["direct"]], rel=1e-12,
                                                            abs=0), count
        assert runs["shm"][0][0] > 0


@pytest.mark.parametrize("n", [2, 3, 7])
def test_small_arrays_ride_in_one_fence(n):
    """Up to fence_payload_bytes, one fence instead of two per scratch round (an 8-byte scratch
    would take two per element)."""
    rng = np.random.default_rng([n, 11])
    world = ThreadWorld(n, scratch_bytes=8, fence_payload_bytes=256)
    for shape, split_dim, concat_dim in [((1,), 0, 0), ((3, 5), 0, 1), ((3, 5), 1, 0), ((32,), 0, 0)]:
        xs = [rng.standard_normal(shape) for _ in range(n)]
        got = world.run(lambda c: (all_to_all(c, xs[c.rank], split_dim, concat_dim), c._fences))
        want = reference.all_to_all(xs, split_dim, concat_dim)
        assert [g.tobytes() for g, _ in got] == [w.tobytes() for w in want]
        assert {fences for _, fences in got} == {1}


def test_the_default_is_shm_in_every_group_of_two_or_more_and_without_scratch_the_exchange():
    assert default_algorithm("all_to_all", 8, 2, shared_memory=True) == "shm"
    assert default_algorithm("all_to_all", 1 << 22, 64, shared_memory=True) == "shm"
    assert default_algorithm("all_to_all", 8, 1, shared_memory=True) == "direct"
    assert default_algorithm("all_to_all", 8, 4, shared_memory=False) == "direct"
    for scratch_bytes, algorithm in ((4 << 20, "shm"), (0, "direct")):
        with VirtualCluster(4, scratch_bytes=scratch_bytes, trace=True) as cluster:
            got = cluster.run(lambda dev: dev.all_to_all(np.full(4, float(dev.rank))))
            used = {dict(e.args)["algorithm"] for e in cluster.trace().events if e.name == "all_to_all"}
        assert used == {algorithm} and [g.tolist() for g in got] == [[0.0, 1.0, 2.0, 3.0]] * 4


def test_a_scratch_smaller_than_one_item_is_a_usage_error_naming_the_way_out():
    world = ThreadWorld(2, scratch_bytes=4)
    with pytest.raises(UsageError,
                       match=r"all_to_all algorithm 'shm' needs scratch memory of at least one float64 "
                                         r"element per member \(2 here\) per device, but the cluster has "
                                         r"scratch_bytes=4; .* algorithm='direct'"):
        world.run(lambda c: all_to_all(c, np.ones(4)))


def test_the_default_exchanges_items_too_wide_for_one_per_member_in_the_scratch():
    """Eight items of 9000 bytes, one per member, are 72 KB: more than a 64 KiB scratch, which the
    default took for shm (which then refused); the default is the exchange there."""
    with VirtualCluster(8, scratch_bytes=64 << 10, trace=True) as cluster:
        got = cluster.run(lambda dev: dev.all_to_all(np.array([f"{dev.rank}>{j}" for j in range(8)],
                                                              dtype="S9000")))
        used = {dict(e.args)["algorithm"] for e in cluster.trace().events if e.name == "all_to_all"}
    assert used == {"direct"}
    assert [g.tolist() for g in got] == [[f"{j}>{r}".encode() for j in range(8)] for r in range(8)]
