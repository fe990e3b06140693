"""What shared-memory collectives owe the traffic counters (transport/traffic.py): tallied per call,
folded into the counters when the device's command ends — also when it ends in an error."""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar import Mesh, VirtualCluster
from virtualpar.errors import DeviceError
from virtualpar.transport.arrivals import FenceGroup
from virtualpar.transport.traffic import OwedTraffic


def _group(ranks: tuple[int, ...], me: int, kind: int = 0) -> FenceGroup:
    return FenceGroup(kind, ranks, me, 6, [None] * 6)


def test_owed_counts_reach_the_counters_only_when_settled():
    counters = np.zeros((2, 6), np.int64)  # this device's (bytes, messages) rows, device 2 of 6
    owed = OwedTraffic(counters[0], counters[1])
    row, col = _group((0, 2, 4), 2), _group((1, 2, 3), 2, kind=1)
    owed.add(row, 100, 1)
    owed.add(row, 20, 2)
    owed.add(col, np.array([5, 999, 7]), 3)  # per member, in group order: ours (999) is not counted
    owed.add(col, np.array([1, 999, 1]), 1)
    assert not counters.any()
    owed.settle()
    assert counters[0].tolist() == [120, 6, 0, 8, 120, 0]
    assert counters[1].tolist() == [3, 4, 0, 4, 3, 0]
    owed.settle()  # nothing owed twice
    assert counters[0].tolist() == [120, 6, 0, 8, 120, 0]


def test_a_cached_count_array_is_not_changed_by_the_tally():
    counters = np.zeros((2, 3), np.int64)
    owed, grp = OwedTraffic(counters[0], counters[1]), _group((0, 1, 2), 0)
    sent = np.array([0, 4, 4])  # the shm all_reduce passes an array it keeps per shape
    owed.add(grp, sent, 1)
    owed.add(grp, sent, 1)
    owed.settle()
    assert sent.tolist() == [0, 4, 4] and counters[0].tolist() == [0, 8, 8]


def _reduce_then_fail(dev):
    dev.all_reduce(np.ones(8), algorithm="shm")
    if dev.rank == 1:
        raise ValueError("after the collective")


def test_a_failed_run_still_counts_the_shm_collectives_it_completed():
    """The counts settle before the device's reply, error or not: the bytes of the completed shm
    all_reduce (each member reads every peer's 64-byte array once, in the one-fence path) show up."""
    with VirtualCluster(Mesh({"x": 3}), timeout=20) as cluster:
        cluster.reset_stats()
        with pytest.raises(DeviceError, match="after the collective"):
            cluster.run(_reduce_then_fail)
        got = cluster.stats().bytes
        want = np.full((3, 3), 64) - np.diag([64] * 3)
        assert (got == want).all(), got
