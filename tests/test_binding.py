"""Device processes bound to their own share of the driver's cores (runtime/binding.py)."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from virtualpar import VirtualCluster
from virtualpar.runtime.binding import cores_of


def _where(dev):
    from virtualpar.transport.waiting import usable_cpus

    return sorted(os.sched_getaffinity(0)), usable_cpus()


@pytest.mark.parametrize("devices, cpus, want", [
    (4, [0, 1], [[0], [1], [0], [1]]),  # oversubscribed: round-robin, one core each
    (2, [0, 1], [[0], [1]]),
    (1, [0, 1], [[0, 1]]),  # fewer devices than cores: a block each, as many as its BLAS threads
    (2, [0, 1, 2, 3, 4], [[0, 1], [2, 3]]),
    (3, [2, 5, 7], [[2], [5], [7]]),  # the CPU numbers the driver may use, not 0..c-1
    (5, [4, 6], [[4], [6], [4], [6], [4]]),
])
def test_cores_are_dealt_round_robin_in_blocks(devices, cpus, want):
    assert [cores_of(r, devices, cpus) for r in range(devices)] == want


@pytest.mark.parametrize("n", [1, 3, 8])
def test_each_device_runs_on_its_share_and_still_counts_the_clusters_cores(n):
    cpus = sorted(os.sched_getaffinity(0))
    with VirtualCluster(n) as c:
        got = c.run(_where)
    k = max(1, len(cpus) // n)
    assert all(len(mine) == k and set(mine) <= set(cpus) for mine, _ in got)
    load = Counter(core for mine, _ in got for core in mine)
    assert max(load.values()) - min(load.values()) <= 1 and (n < len(cpus) or len(load) == len(cpus))
    assert all(shared == len(cpus) for _, shared in got)  # polling and BLAS threads see the whole machine
    assert sorted(os.sched_getaffinity(0)) == cpus  # the driver is left alone


def test_bind_false_leaves_devices_on_every_core():
    cpus = sorted(os.sched_getaffinity(0))
    with VirtualCluster(3, bind=False) as c:
        assert c.run(_where) == [(cpus, len(cpus))] * 3
