"""The shared-memory all_gather and broadcast (collectives/shm_copy.py): pieces of any size and dim,
rounds through a small scratch, shapes and dtypes from the headers, bytes, the default choice, and
modelled time.

Values are checked against ``numpy.concatenate`` of the pieces and the root's array; the modelled
clocks and the bytes against the ring all_gather and the binomial-tree broadcast run for real on
the same topology.
"""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar import Mesh, VirtualCluster
from virtualpar.collectives import ThreadWorld, shm_copy as shm
from virtualpar.collectives.shm_copy import COPY_MIN_ROOM, GATHER_HEADER
from virtualpar.errors import UsageError

from ._slow_reader import slow_reader_cluster


def _piece(rank: int, dim: int, length: int, dtype: str = "float64") -> np.ndarray:
    shape = [3, 2, 4]
    shape[dim] = length
    x = np.random.default_rng(rank).standard_normal(shape) * 50
    return x.astype(dtype)


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("scratch_bytes", [GATHER_HEADER + 1, GATHER_HEADER + 40, 1 << 16])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_uneven_pieces_through_any_scratch_match_numpy_concatenate(n, scratch_bytes, dim, strided):
    world = ThreadWorld(n, scratch_bytes=scratch_bytes)
    for lengths in ([2] * n, [r % 3 for r in range(n)], [0] * n, [7 * r + 1 for r in range(n)]):
        pieces = [_piece(r, dim, lengths[r]) for r in range(n)]
        got = world.run(lambda c: shm.all_gather(c, pieces[c.rank], dim))
        want = np.concatenate(pieces, axis=dim)
        for g in got:
            assert g.shape == want.shape and g.tobytes() == want.tobytes()


@pytest.mark.parametrize("n", [2, 5])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_pieces_alike_are_gathered_in_one_strided_copy_as_numpy_concatenates_them(n, dim, strided):
    """Every header alike (stamp, shape, dtype): the strided path copies all n pieces at once into
    (before dim, n, after) blocks of the result; the same bytes as ``numpy.concatenate``."""
    world = ThreadWorld(n, scratch_bytes=1 << 12)
    for dtype in ("float64", "int8", "complex64"):
        pieces = [_piece(r, dim, 3, dtype) for r in range(n)]
        got = world.run(lambda c: shm.all_gather(c, pieces[c.rank], dim))
        want = np.concatenate(pieces, axis=dim)
        assert all(g.shape == want.shape and g.tobytes() == want.tobytes() for g in got)


@pytest.mark.parametrize("dtype", ["bool", "int8", "float16", "complex128", "uint64"])
def test_every_dtype_is_gathered_as_its_bytes(dtype):
    # a round every 3 bytes: items split across rounds
    world = ThreadWorld(3, scratch_bytes=GATHER_HEADER + 3)
    pieces = [_piece(r, 0, r + 1, dtype) for r in range(3)]
    for g in world.run(lambda c: shm.all_gather(c, pieces[c.rank], 0)):
        np.testing.assert_array_equal(g, np.concatenate(pieces))


def test_a_non_contiguous_piece_is_gathered_by_value():
    world = ThreadWorld(2, scratch_bytes=1 << 12)
    pieces = [np.arange(24.0).reshape(4, 6)[:, ::2] + 100 * r for r in range(2)]
    for g in world.run(lambda c: shm.all_gather(c, pieces[c.rank], 1)):
        np.testing.assert_array_equal(g, np.concatenate(pieces, axis=1))


def test_pieces_that_differ_other_than_along_dim_are_refused_not_reinterpreted(strided):
    """With the contract check off nothing else would notice: 2x6 and 3x4 hold as many bytes."""
    world = ThreadWorld(2, scratch_bytes=1 << 12)
    pieces = [np.ones((2, 6)), np.ones((3, 4))]
    with pytest.raises(UsageError, match=r"pieces may differ only in their length along dim 0"):
        world.run(lambda c: shm.all_gather(c, pieces[c.rank], 0))


def test_pieces_of_another_dtype_are_refused_not_reinterpreted(strided):
    """float64 against int64 (same size): the bytes of one read as the other."""
    world = ThreadWorld(2, scratch_bytes=1 << 12)
    pieces = [np.arange(3.0), np.arange(10, 13)]
    with pytest.raises(UsageError, match=r"float64.*int64|int64.*float64"):
        world.run(lambda c: shm.all_gather(c, pieces[c.rank], 0))


def _out_of_order(dev):
    x = np.full(2, float(dev.rank))
    if dev.rank == 0:
        got = dev.all_gather(x)
        dev.barrier()
    else:
        dev.barrier()
        got = dev.all_gather(x)
    return got


def test_members_in_different_calls_are_refused_with_the_contract_check_off(strided):
    """Device 0's all_gather met device 1's barrier at a fence: it read the piece device 1 had left
    in its scratch in the *previous* all_gather, silently."""
    with VirtualCluster(2, check_collectives=False, timeout=10) as cluster:
        cluster.run(lambda dev: dev.all_gather(np.full(2, 100.0 + dev.rank)))  # leaves a piece behind
        with pytest.raises(UsageError, match="not in this call"):
            cluster.run(_out_of_order)


def _uneven_shape_in_group_b(dev):
    return dev.all_gather(np.ones((2, 3) if dev.rank != 4 else (2, 4)), dim=0, group="b")


def test_a_shape_mismatch_names_the_device_that_saw_it_not_its_position_in_the_group():
    with VirtualCluster(Mesh({"a": 2, "b": 3}), check_collectives=False, timeout=10) as cluster:
        with pytest.raises(UsageError, match="pieces may differ only") as err:
            cluster.run(_uneven_shape_in_group_b)
        assert err.value.rank in (3, 4, 5)  # group b of devices 3, 4, 5: positions 0..2 name other devices


def test_a_scratch_without_room_for_the_header_is_a_usage_error_and_the_default_avoids_it():
    world = ThreadWorld(2, scratch_bytes=GATHER_HEADER)
    with pytest.raises(UsageError, match="scratch memory of more than"):
        world.run(lambda c: shm.all_gather(c, np.ones(2), 0))
    # the default wants room for rounds that are worth their two fences each
    assert not shm.usable("all_gather", GATHER_HEADER + COPY_MIN_ROOM - 1, 8, 4)
    assert shm.usable("all_gather", GATHER_HEADER + COPY_MIN_ROOM, 8, 4)
    for name in ("all_reduce", "reduce_scatter", "all_to_all"):  # likewise, for the same reason
        assert shm.usable(name, COPY_MIN_ROOM, 8, 4) and not shm.usable(name, COPY_MIN_ROOM - 1, 8, 4)
    # and with room for what the algorithm needs: one item per member for these two, one in all else
    assert shm.usable("all_reduce", COPY_MIN_ROOM, 9000, 8)
    for name in ("reduce_scatter", "all_to_all"):
        assert not shm.usable(name, COPY_MIN_ROOM, 9000, 8) and shm.usable(name, 72000, 9000, 8)


def _gather(dev, algorithm, group, lengths):
    x = _piece(dev.rank, 0, lengths[dev.rank])
    dev.compute(flops=3e9 * dev.rank)  # members enter at different modelled clocks
    got = dev.all_gather(x, dim=0, group=group, algorithm=algorithm)
    return got, dev.clock


@pytest.mark.parametrize("group", [None, "b", ("a", "b")])
@pytest.mark.parametrize("hardware", ["h100-node", None])
def test_shm_costs_exactly_what_the_ring_all_gather_costs_and_counts_the_same_bytes(group, hardware, strided):
    _same_results_clocks_and_bytes(_gather, "ring", hardware, group, [5, 1, 9, 0, 3, 40])
    _same_results_clocks_and_bytes(_gather, "ring", hardware, group, [6] * 6)  # alike: strided rows


def _same_results_clocks_and_bytes(program, reference: str, hardware, *args) -> None:
    """``program(dev, algorithm, *args)`` with ``shm`` and with the message algorithm ``reference``
    run for real on a 2x3 mesh: the same bytes, modelled clocks (to rounding) and total traffic."""
    seen = {}
    for algorithm in ("shm", reference):
        with VirtualCluster(Mesh({"a": 2, "b": 3}), hardware=hardware) as cluster:
            out = cluster.run(program, algorithm, *args)
            seen[algorithm] = ([o[0] for o in out], [o[1] for o in out], cluster.stats())
    (got_shm, clock_shm, stats_shm), (got_ref, clock_ref, stats_ref) = seen["shm"], seen[reference]
    for a, b in zip(got_shm, got_ref):
        assert a.tobytes() == b.tobytes()
    np.testing.assert_allclose(clock_shm, clock_ref, rtol=1e-12)
    assert stats_shm.total_bytes == stats_ref.total_bytes > 0


def test_the_default_all_gather_is_shm_and_without_scratch_the_ring():
    for scratch, want in ((4 << 20, "shm"), (GATHER_HEADER + 100, "ring")):
        with VirtualCluster(4, scratch_bytes=scratch) as cluster:
            got = cluster.run(lambda dev: dev.all_gather(np.full(2, float(dev.rank)), dim=0))
            assert all(np.array_equal(g, np.repeat(np.arange(4.0), 2)) for g in got)
            assert {dict(e.args)["algorithm"] for e in cluster.trace().events if e.name == "all_gather"} == {
                want
            }


def test_a_mismatched_all_gather_on_devices_is_a_collective_mismatch_by_default():
    from virtualpar import CollectiveMismatch

    with VirtualCluster(3, timeout=10) as cluster:
        with pytest.raises(CollectiveMismatch, match="differs in: dtype"):
            cluster.run(lambda dev: dev.all_gather(np.ones(2, np.float32 if dev.rank == 1 else np.float64)))
        # uneven pieces are allowed: their digests differ, the full comparison masks the dim
        got = cluster.run(lambda dev: dev.all_gather(np.full(dev.rank + 1, float(dev.rank))))
        assert all(np.array_equal(g, [0.0, 1.0, 1.0, 2.0, 2.0, 2.0]) for g in got)


# -- broadcast -----------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("scratch_bytes", [GATHER_HEADER + 1, GATHER_HEADER + 40, 1 << 16])
@pytest.mark.parametrize("dtype", ["float64", "bool", "int8", "complex64", "U3", "datetime64[s]"])
def test_broadcast_through_any_scratch_gives_every_member_the_roots_array(n, scratch_bytes, dtype, strided):
    world = ThreadWorld(n, scratch_bytes=scratch_bytes)
    for root, shape in ((0, (3, 5)), (n - 1, (0, 4)), (n // 2, (7,))):
        xs = [(np.arange(int(np.prod(shape))).reshape(shape) * (r + 2)).astype(dtype) for r in range(n)]
        got = world.run(lambda c: shm.broadcast(c, xs[c.rank] if c.rank == root or c.rank % 2 else None,
                                                root))
        for g in got:  # what a non-root passes is ignored: the root's array, its shape and dtype
            assert (
                g.dtype == xs[root].dtype and g.shape == xs[root].shape and g.tobytes() == xs[root].tobytes()
            )


def test_a_broadcast_scratch_without_room_for_the_header_is_a_usage_error_and_the_default_avoids_it():
    world = ThreadWorld(2, scratch_bytes=GATHER_HEADER)
    with pytest.raises(UsageError, match="broadcast algorithm 'shm' needs scratch memory of more than"):
        world.run(lambda c: shm.broadcast(c, np.ones(2) if c.rank == 0 else None, 0))
    assert not shm.usable("broadcast", GATHER_HEADER + 1, 8,
                          4) and shm.usable("broadcast", GATHER_HEADER + COPY_MIN_ROOM, 8, 4)


def _broadcast(dev, algorithm, group, root):
    x = np.arange(300.0) * (dev.rank + 1)
    dev.compute(flops=3e9 * dev.rank)  # members enter at different modelled clocks
    return dev.broadcast(x if dev.group_rank(group) == root else None, root=root, group=group,
                         algorithm=algorithm), dev.clock


@pytest.mark.parametrize("group,root", [(None, 0), (None, 5), ("b", 2), (("a", "b"), 3)])
@pytest.mark.parametrize("hardware", ["h100-node", None])
def test_shm_broadcast_costs_exactly_what_the_tree_costs_and_counts_the_same_bytes(group, root, hardware):
    _same_results_clocks_and_bytes(_broadcast, "tree", hardware, group, root)


def test_the_default_broadcast_is_shm_and_without_scratch_the_tree():
    for scratch, want in ((4 << 20, "shm"), (GATHER_HEADER + 100, "tree")):
        with VirtualCluster(4, scratch_bytes=scratch) as cluster:
            got = cluster.run(lambda dev: dev.broadcast(np.full(3, 7.0) if dev.rank == 1 else None, root=1))
            assert all(np.array_equal(g, [7.0, 7.0, 7.0]) for g in got)
            assert {dict(e.args)["algorithm"] for e in cluster.trace().events if e.name == "broadcast"} == {
                want
            }


def _roots_disagree(dev):
    return dev.broadcast(np.full(3, 10.0 + dev.rank), root=0 if dev.rank == 0 else 1, algorithm="shm")


def _broadcast_meets_all_gather(dev):
    x = np.full(3, 10.0 + dev.rank)
    return dev.broadcast(x, algorithm="shm") if dev.rank == 0 else dev.all_gather(x, algorithm="shm")


def _other_kind_of_group(dev):  # devices 0, 2 all_gather over "a" and then barrier twice over "b"
    if dev.index.b == 0:
        got = dev.all_gather(np.full(3, 10.0 + dev.rank), group="a", algorithm="shm")
        dev.barrier(group="b")
        dev.barrier(group="b")
        return got
    # devices 1, 3: the root left an all_gather piece
    return dev.broadcast(None, root=0, group="b", algorithm="shm")


@pytest.mark.parametrize("program,mesh",
                         [(_roots_disagree, 3), (_roots_disagree, 2), (_broadcast_meets_all_gather, 3),
                                          (_other_kind_of_group, {"a": 2, "b": 2})])
def test_members_that_disagree_on_root_op_or_group_are_refused_with_the_check_off(program, mesh):
    """Each returned other members' or other calls' data silently (the tree raised or deadlocked)."""
    with VirtualCluster(Mesh(mesh), check_collectives=False, timeout=10) as cluster:
        with pytest.raises(UsageError, match="not in this call"):
            cluster.run(program)


def _row_then_column(dev, n):
    row = dev.all_gather(np.full(n, 1.0 + dev.rank), group="b", algorithm="shm")
    col = dev.all_gather(np.full(n, 100.0 * (dev.rank + 1)), group="a", algorithm="shm")
    return row, col


def test_a_slow_reader_in_one_group_keeps_its_peer_from_refilling_the_scratch_in_another(
    monkeypatch, strided
):
    """Device 0 dawdles after the row all_gather's first fence, before copying device 1's piece
    out of its scratch.  Device 1 has copied device 0's by then and moves on to its column group
    {1, 3}, whose first round refills that scratch: the row call's last fence must hold it back,
    or device 0 reads the column call's header (refused) or piece."""
    with slow_reader_cluster(monkeypatch, fence_number=1) as cluster:  # every header and piece is published
        got = cluster.run(_row_then_column, 1000)
    for rank, (row, col) in enumerate(got):
        pair, column = (rank & ~1, rank | 1), (rank % 2, rank % 2 + 2)  # row groups {0, 1}, {2, 3}
        np.testing.assert_array_equal(row, np.repeat([1.0 + r for r in pair], 1000))
        np.testing.assert_array_equal(col, np.repeat([100.0 * (r + 1) for r in column], 1000))
