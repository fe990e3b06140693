"""Fences per group kind (transport/arrivals.py, runtime/fence_kinds.py), and the cache of
validated collective calls (CollectiveSpec.build): groups whose ranks are not evenly spaced,
interleaved fences of every kind, a mismatch and a deadlock inside a sub-group."""

from __future__ import annotations

import time

import numpy as np
import pytest

from virtualpar import Mesh, VirtualCluster
from virtualpar.errors import CollectiveMismatch, Deadlock, PayloadError, UsageError
from virtualpar.runtime.fence_kinds import fence_kind, fence_kinds, kind_axes
from virtualpar.transport.arrivals import ArrivalCounters, FenceGroup
from virtualpar.transport.shm import Layout, SharedArena

MESH = {"a": 2, "b": 2, "c": 2}  # groups over ("a", "c"): ranks 0, 1, 4, 5 — not evenly spaced


def test_kinds_count_the_axes_longer_than_one_and_invert():
    mesh = Mesh({"dp": 2, "one": 1, "tp": 4})
    assert fence_kinds(mesh) == 4  # dp and tp; the axis of size 1 changes no group
    assert [fence_kind(mesh, axes) for axes in [(), ("dp",), ("tp",), ("dp", "tp"),
                                                ("dp", "one", "tp")]] == [0, 1, 2, 3, 3]
    assert [kind_axes(mesh, k) for k in range(4)] == [(), ("dp",), ("tp",), ("dp", "tp")]


def test_a_fence_group_reads_evenly_spaced_members_as_one_slice_and_others_one_by_one():
    words = memoryview(bytearray(8 * 16)).cast("Q")
    for r in range(16):
        words[r] = 100 + r
    even = FenceGroup(1, (1, 3, 5, 7), me=5, devices=8, doorbells=list(range(8)))
    assert list(even.words(words, 0)) == [109, 111, 113, 115]  # row 1 of the plane: words 8 + rank
    uneven = FenceGroup(0, (0, 1, 4, 5), me=4, devices=8, doorbells=list(range(8)))
    assert list(uneven.words(words, 8)) == [108, 109, 112, 113]
    assert uneven.bells == [0, 1, None, 5] and (uneven.mine, uneven.done) == (4, 0)


class _Bell:
    """A doorbell that notes who was rung, in order."""

    def __init__(self, rank: int, rung: list[int]) -> None:
        self.rank, self.rung = rank, rung

    def release(self) -> None:
        self.rung.append(self.rank)


@pytest.mark.parametrize("ranks", [(0, 1, 2, 3), (0, 1, 3)], ids=["evenly spaced", "uneven"])
def test_the_last_member_rings_the_others_in_the_order_they_arrived(ranks):
    layout = Layout(4, 4096)
    arena = SharedArena.create(layout.total_bytes)
    arena.unlink()
    rung: list[int] = []
    bells = [_Bell(r, rung) for r in range(4)]
    members = {r: ArrivalCounters(arena, layout, r, bells) for r in ranks}
    groups = {r: members[r].group(0, ranks) for r in ranks}
    *early, last = ranks[2], ranks[0], *ranks[3:], ranks[1]  # not rank order
    for fence in (1, 2):
        rung.clear()
        for r in early:
            assert members[r].arrive(groups[r]) == fence and not members[r].arrived(groups[r], fence)
            time.sleep(0.002)  # distinct stamps
        assert members[last].arrive(groups[last]) == fence
        assert rung == list(early) and all(members[r].arrived(groups[r], fence) for r in ranks)
        early = early[::-1]


def test_a_release_rings_only_its_owner_and_only_the_owner_awaits_it():
    """A release (a call's last fence, transport/arrivals.py): nobody waits; the owner remembers
    it until every member has arrived, and the last to arrive rings the owner alone."""
    layout = Layout(4, 4096)
    arena = SharedArena.create(layout.total_bytes)
    arena.unlink()
    rung: list[int] = []
    members = [ArrivalCounters(arena, layout, r, [_Bell(b, rung) for b in range(4)]) for r in range(4)]
    groups = [m.group(0, range(4)) for m in members]
    for order, owed in (((2, 0, 3, 1), {0}), ((1, 2, 3, 0), set())):  # the owner in the middle, then last
        rung.clear()
        for r in order:
            members[r].release(groups[r], 0, r == 0)
        fence = members[0].next_fence(groups[0]) - 1
        assert rung == ([0] if owed else []) and all(m.arrived(g, fence) for m, g in zip(members, groups))
        assert {r for r in range(4) if members[r].unreleased} == owed  # the owner arrived before the last
        if owed:
            assert members[0].unreleased == {0: (groups[0], fence)}
            members[0].reset()
            assert not members[0].unreleased


def _release_after(dev):
    from virtualpar.runtime.collective_spec import CollectiveSpec
    from virtualpar.runtime.group_comm import GroupComm

    spec = CollectiveSpec.build(dev._core, "barrier", None, dev._group(None), None, {})
    comm = GroupComm(dev._core, spec, time.monotonic() + 5, None, None)
    comm.fence()  # a call's first fence carries the members' clocks: its readers may still be reading
    with pytest.raises(RuntimeError, match="must follow a fence that carries nothing"):
        comm.release(0)
    comm.fence()
    comm.release(0)
    comm = GroupComm(dev._core, spec, time.monotonic() + 5, None, None)
    comm.fence()
    comm.fence_exchange(np.ones(2))  # a payload, likewise
    with pytest.raises(RuntimeError, match="must follow a fence that carries nothing"):
        comm.release(0)
    comm.fence()
    comm.release(0)
    return dev.all_reduce(np.ones(3000), algorithm="shm")  # the owner (device 0) waits for its release


def test_a_release_must_follow_a_fence_that_carries_nothing():
    with VirtualCluster(3, trace=False) as cluster:
        for got in cluster.run(_release_after):
            np.testing.assert_array_equal(got, np.full(3000, 3.0))


def _interleaved(dev, rounds: int) -> list[list[float]]:
    """Barriers and shm all_reduces on every kind of group, in an order that mixes them."""
    rng = np.random.default_rng(7)  # the same sequence on every device
    groups = [None, "a", "b", "c", ("a", "b"), ("a", "c"), ("b", "c")]
    out = []
    for _ in range(rounds):
        group = groups[rng.integers(len(groups))]
        if rng.random() < 0.5:
            dev.barrier(group=group)
        else:
            x = np.arange(5.0) * (dev.rank + 1)
            out.append(dev.all_reduce(x, group=group, algorithm="shm").tolist())
    return out


def test_interleaved_fences_of_every_kind_give_numpy_results():
    mesh = Mesh(MESH)
    rng = np.random.default_rng(7)
    groups = [None, "a", "b", "c", ("a", "b"), ("a", "c"), ("b", "c")]
    want = {r: [] for r in range(mesh.size)}
    for _ in range(40):  # the oracle replays the same sequence
        group = groups[rng.integers(len(groups))]
        if rng.random() >= 0.5:
            for r in range(mesh.size):
                members = mesh.group_of(r, mesh.axes(group))
                want[r].append((np.arange(5.0) * sum(m + 1 for m in members)).tolist())
    with VirtualCluster(mesh, timeout=30) as c:
        assert c.run(_interleaved, 40) == [want[r] for r in range(mesh.size)]


def _mismatch_in_uneven_group(dev):
    shape = 3 if dev.rank != 4 else 4
    return dev.all_reduce(np.ones(shape), group=("a", "c"), algorithm="shm")


def test_a_mismatch_inside_an_unevenly_spaced_group_names_its_members():
    with VirtualCluster(Mesh(MESH), timeout=30) as c:
        with pytest.raises(CollectiveMismatch) as info:
            c.run(_mismatch_in_uneven_group)
        err = info.value
        assert err.group == (0, 1, 4, 5) if err.rank in (0, 1, 4, 5) else err.group == (2, 3, 6, 7)
        assert "differs in: shape" in str(err) and "device 4" in str(err)


def _skip_in_group(dev):
    if dev.rank != 5:
        dev.barrier(group=("a", "c"))


def test_a_device_skipping_a_sub_group_barrier_is_named_as_the_one_its_peers_wait_for():
    with VirtualCluster(Mesh(MESH), timeout=30, check_collectives=False) as c:
        t0 = time.monotonic()
        with pytest.raises(Deadlock) as info:
            c.run(_skip_in_group)
        assert time.monotonic() - t0 < 10
        text = str(info.value)
        assert "waits fence with [5] ← device 5 has returned from the run" in text
        assert c.run(lambda dev: dev.barrier() or dev.rank) == list(range(8))  # the reset cleared the counts


def _cached_then_wrong(dev, wrong):
    dev.broadcast(np.ones(2), root=1)
    dev.all_reduce(np.ones(2))
    if wrong == "root":
        dev.broadcast(np.ones(2), root=True)
    else:
        dev.all_reduce([1.0, 1.0])


@pytest.mark.parametrize("wrong,error", [("root", UsageError), ("list", PayloadError)])
def test_a_call_validated_before_does_not_let_a_wrong_one_through(wrong, error):
    """root=True hashes like root=1, and a list is no array: neither may reuse a cached validation."""
    with VirtualCluster(2, timeout=30) as c:
        with pytest.raises(error):
            c.run(_cached_then_wrong, wrong)


def _strided_and_scalar_inputs(dev) -> list:
    """Small all_reduces whose inputs are not C-contiguous (or are 0-d) ride a fence as they are:
    the payload slot takes them flattened in C order; repeated, so the kept slot views are used."""
    base = np.arange(24.0).reshape(4, 6) * (dev.rank + 1)
    out = []
    for _ in range(2):
        for group in (None, ("a", "c")):
            out.append(dev.all_reduce(base.T, group=group).tolist())  # Fortran order
            out.append(dev.all_reduce(base[::2, ::3], group=group).tolist())  # strided
            out.append(float(dev.all_reduce(np.full((), dev.rank + 1, np.float32), group=group)))  # 0-d
            out.append(dev.all_reduce(np.arange(3, dtype=np.int16) + dev.rank, group=group,
                                      op="max").tolist())
    return out


def test_non_contiguous_and_0d_inputs_ride_a_fence_as_numpy_reduces_them():
    mesh = Mesh(MESH)
    with VirtualCluster(mesh, timeout=30) as c:
        got = c.run(_strided_and_scalar_inputs)
    base = np.arange(24.0).reshape(4, 6)
    for r in range(mesh.size):
        want = []
        for group in (None, ("a", "c")):
            members = mesh.group_of(r, mesh.axes(group))
            total = sum(m + 1 for m in members)
            want += [(base.T * total).tolist(), (base[::2, ::3] * total).tolist(), float(total),
                     (np.arange(3) + max(members)).tolist()]
        assert got[r] == want * 2
