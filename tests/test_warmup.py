"""The start-up warm-up (runtime/warmup.py): it runs, nothing of it shows, and its failures are named.

The independent reference is the same cluster started with ``warm_up=False``: the same program
must leave the same clocks, traffic, flight records and trace events on both.  Whether it makes
the first call faster is the benchmarks' business (benchmarks/bench_scale.py).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from virtualpar import ClusterClosedError, DeviceDied, DeviceError, VirtualCluster
from virtualpar.runtime import warmup, worker
from virtualpar.runtime.warmup import (QUICKEN_ROUNDS, RESULT_RESERVE_BYTES, WARM_MAX_PEERS,
                                       WARM_RESULT_BYTES,
                                       WARM_SCRATCH_BYTES, result_reserve_bytes, scratch_warm_bytes)

KIB, MIB = 1 << 10, 1 << 20


def _program(dev):
    dev.barrier()
    small = dev.all_reduce(np.full(3, float(dev.rank)))
    large = dev.all_reduce(np.full(20_000, 1.0), group="x")
    if dev.rank < 2:
        got = dev.recv(1) if dev.rank == 0 else dev.send(np.arange(5.0), 0)
    else:
        got = None
    return small.tolist(), float(large[0]), None if got is None else got.tolist()


def _seen(cluster, results):
    records = [[(r.seq, r.state, r.text, r.model_start, r.model_end) for r in cluster.flight_records(k)]
               for k in range(cluster.size)]
    events = sorted((e.rank, e.seq, e.kind, e.name, e.model_start, e.model_end, e.nbytes, e.peer, e.group,
                     e.flow, e.args)
                    for e in cluster.trace().events)
    return results, cluster.clocks(), cluster.stats().total_bytes, records, events


@pytest.mark.parametrize("scratch", [4 * MIB, 0])  # shared-memory collectives, and message-based ones
def test_the_warm_up_leaves_nothing_a_user_can_see(scratch):
    seen = {}
    for warm in (True, False):
        with VirtualCluster({"x": 2, "y": 2}, hardware="h100-node", scratch_bytes=scratch,
                            warm_up=warm) as cluster:
            fresh = (cluster.clocks(), cluster.stats().total_bytes, list(cluster.trace().events),
                     [cluster.flight_records(r) for r in range(4)])
            assert fresh == ([0.0] * 4, 0, [], [[]] * 4)
            assert cluster.run(lambda dev: (dev.op_seq, dev.clock)) == [(0, 0.0)] * 4
            seen[warm] = _seen(cluster, cluster.run(_program))
    assert seen[True] == seen[False]
    assert seen[True][2] > 0 and seen[True][0][0][1] == 2.0  # the program did move data


def test_the_warm_up_runs_the_collective_call_paths_and_warm_up_false_skips_them():
    """The devices' caches of validated calls hold the warm-up's barrier and all_reduces."""
    def cached(dev):
        return sorted({key[0] for key in dev._core.specs})

    with VirtualCluster(4) as cluster:
        assert cluster.run(cached)[0] == ["all_gather", "all_reduce", "barrier", "broadcast"]
    with VirtualCluster(4, warm_up=False) as cluster:
        assert cluster.run(cached)[0] == []


def _counting_warm_up(dev):
    """The real warm-up, counting its barriers (kept in ``dev.state``, which it does not wipe)."""
    calls = []

    def barrier(*args, **kwargs):
        calls.append(1)
        return type(dev).barrier(dev, *args, **kwargs)

    dev.barrier = barrier
    try:
        warmup.warm_up(dev)
    finally:
        del dev.barrier
        dev.state["warm-up barriers"] = len(calls)


@pytest.mark.parametrize("devices, rounds", [(4, QUICKEN_ROUNDS), (WARM_MAX_PEERS + 1, 2)])
def test_the_cheap_calls_run_until_cpython_has_specialised_them_up_to_64_devices(
    monkeypatch, devices, rounds
):
    monkeypatch.setattr(worker, "warm_up", _counting_warm_up)  # forked devices inherit it
    with VirtualCluster(devices, timeout=60) as cluster:
        assert cluster.run(lambda dev: dev.state["warm-up barriers"]) == [rounds] * devices
        assert cluster.run(lambda dev: dev.op_seq) == [0] * devices  # and none of them shows


def test_scratch_warm_bytes_stays_within_its_budgets():
    payload = 8 * KIB
    assert scratch_warm_bytes(16, 4 * MIB, payload) == WARM_SCRATCH_BYTES // 16 == 2 * MIB
    assert scratch_warm_bytes(2, 4 * MIB, payload) == 4 * MIB  # at most the scratch there is
    assert scratch_warm_bytes(WARM_MAX_PEERS, 4 * MIB, payload) == WARM_SCRATCH_BYTES // WARM_MAX_PEERS
    assert scratch_warm_bytes(WARM_MAX_PEERS + 1, 4 * MIB, payload) == 0  # mapping every peer costs too much
    assert scratch_warm_bytes(3, 4 * MIB, payload) % 4096 == 0  # whole pages
    assert scratch_warm_bytes(4, 0, payload) == 0  # no scratch
    assert scratch_warm_bytes(4, payload, payload) == 0  # would ride in a fence
    assert scratch_warm_bytes(1, 4 * MIB, payload) == 0


def _failing_warm_up(how):
    real = warmup.warm_up

    def warm_up(dev):
        try:
            if how == "late":  # traffic first, then the failure
                dev.all_reduce(np.ones(4))
            if dev.rank == 1:
                if how == "die":
                    os._exit(7)
                raise RuntimeError("broken warm-up")
        finally:
            warmup._forget(dev._core)  # as the real one does, whatever happens
        real(dev)

    return warm_up


def test_a_device_that_dies_in_the_warm_up_fails_the_first_call_by_name(monkeypatch):
    monkeypatch.setattr(worker, "warm_up", _failing_warm_up("die"))  # forked devices inherit it
    cluster = VirtualCluster(4)
    try:
        with pytest.raises(DeviceDied, match=r"device 1 .*warm-up"):
            cluster.run(lambda dev: dev.rank)
        with pytest.raises(ClusterClosedError):
            cluster.run(lambda dev: dev.rank)
    finally:
        cluster.close()


@pytest.mark.parametrize("how", ["raise", "late"])
def test_an_error_in_the_warm_up_is_raised_by_the_first_call_and_the_cluster_recovers(monkeypatch, how):
    monkeypatch.setattr(worker, "warm_up", _failing_warm_up(how))
    with VirtualCluster(4) as cluster:
        with pytest.raises(DeviceError,
                           match="start-up warm-up failed, before any call of yours.*broken warm-up") as err:
            cluster.stats()
        assert err.value.rank == 1
        assert cluster.stats().total_bytes == 0 and cluster.clocks() == [0.0] * 4  # nothing of it stays
        assert cluster.run(lambda dev: dev.all_reduce(np.ones(2)).tolist()) == [[4.0, 4.0]] * 4
        assert cluster.run(lambda dev: dev.op_seq) == [1] * 4


def test_the_flight_records_of_a_device_that_died_in_the_warm_up_stay_readable(monkeypatch):
    monkeypatch.setattr(worker, "warm_up", _failing_warm_up("die"))
    cluster = VirtualCluster(3)
    try:
        # the first call: the death is found, not raised here
        assert isinstance(cluster.flight_records(1), list)
        with pytest.raises(ClusterClosedError, match="warm-up"):
            cluster.run(lambda dev: dev.rank)
    finally:
        cluster.close()


def test_shuffled_mode_draws_the_same_pauses_with_and_without_the_warm_up():
    """The warm-up's message-based collectives (no scratch) drew from the devices' shuffle
    generators, so a seed replayed other pauses than with warm_up=False."""
    def draws(dev):
        return [dev._core.endpoint.shuffle.delay() for _ in range(5)]

    seen = []
    for warm in (True, False):
        with VirtualCluster(4, shuffle=7, scratch_bytes=0, warm_up=warm) as cluster:
            seen.append(cluster.run(draws))
    assert seen[0] == seen[1]


def test_close_right_after_start_neither_waits_for_nor_leaks_the_warm_up():
    cluster = VirtualCluster(8)
    cluster.close()
    assert cluster.closed
    for pid in cluster.pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_short_op_timeout_is_the_users_not_the_warm_ups():
    """Eight cold devices on two cores take longer than 0.1 ms to meet at the warm-up's first
    barrier: with the user's timeout the warm-up failed and the first call raised its timeout."""
    with VirtualCluster(8, timeout=1e-4) as cluster:
        assert cluster.run(lambda dev: dev.rank) == list(range(8))


def test_the_warm_up_keeps_no_result_buffer():
    """Its scratch all_reduce's result is a size the user may never use: n of them held for nothing."""
    with VirtualCluster(4) as cluster:
        assert cluster.run(lambda dev: dev._core.pool.idle_bytes) == [0] * 4


def test_result_reserve_bytes_stays_within_its_budgets():
    assert result_reserve_bytes(4) == RESULT_RESERVE_BYTES == 1 * MIB
    assert result_reserve_bytes(256) == WARM_RESULT_BYTES // 256 == 256 * KIB
    assert result_reserve_bytes(100) % 4096 == 0 and result_reserve_bytes(100) * 100 <= WARM_RESULT_BYTES


def test_the_first_large_result_lands_in_the_warm_reserve():
    """Each device's pool holds a faulted-in reserve after the warm-up (none without it), and a
    first all_reduce of a size never seen before builds its result there: no fresh page faults
    (6-8 in all here, against ~470 on a cluster without the warm-up)."""
    import resource

    def first(dev):
        pool = dev._core.pool
        home = None if pool._reserve is None else pool._reserve.ctypes.data
        x = np.full(40_000, 1.0)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        got = dev.all_reduce(x)  # 320,000 bytes: shm, through the pool; 78 pages if they were fresh
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        return pool.reserve_bytes, got.ctypes.data == home, float(got.sum()), faults < 40

    with VirtualCluster(4) as cluster:
        assert cluster.run(first) == [(result_reserve_bytes(4), True, 160_000.0, True)] * 4
    with VirtualCluster(4, warm_up=False) as cluster:
        assert cluster.run(first) == [(0, False, 160_000.0, False)] * 4


def _arena_rss(dev, name: str) -> int:
    """Bytes of the cluster's shared arena ``name`` this process has mapped (its ``Rss`` in
    /proc/self/smaps)."""
    lines = open("/proc/self/smaps").read().splitlines()
    for i, line in enumerate(lines):
        if name in line:
            rss = next(entry for entry in lines[i + 1:] if entry.startswith("Rss:"))
            return int(rss.split()[1]) * KIB
    raise AssertionError(f"no mapping of {name} in /proc/self/smaps")


def test_every_device_maps_the_warmed_scratch_of_every_peer():
    """The warm-up's all_reduce reads only two slices of each peer's scratch; the rest of what it
    wrote must be mapped here too, or a first all_reduce of another size faults on it."""
    n = 4
    with VirtualCluster(n) as cluster:
        layout = cluster.layout
        warmed = scratch_warm_bytes(n, layout.scratch_bytes, layout.fence_payload_bytes)
        assert warmed > 0
        for rss in cluster.run(_arena_rss, cluster._arena.name):
            assert rss >= n * warmed  # every device's warmed scratch, its own and its peers'


def _unmapped_doorbells(dev) -> int:
    """How many doorbells this device has not mapped: a doorbell is a POSIX semaphore on a page of
    its own (``handle`` is its address), and that page's ``Rss`` in /proc/self/smaps stays 0 in a
    forked process until the process touches it.  (Exact: counting page faults around reads of the
    bells also counted the first call of libc's ``sem_getvalue`` on some machines.)"""
    spans = []
    for line in open("/proc/self/smaps").read().splitlines():
        head = line.split(maxsplit=1)[0]
        if head == "Rss:":
            spans[-1][2] = int(line.split()[1])
        elif not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            spans.append([lo, hi, 0])
    resident = [next(rss for lo, hi, rss in spans if lo <= bell._semlock.handle < hi)
                for bell in dev._core.endpoint.doorbells]
    return resident.count(0)


@pytest.mark.parametrize("warm", [True, False])
def test_every_device_maps_every_doorbell_in_the_warm_up(warm):
    """A fence's last member rings every other member: each doorbell is a page of its own, mapped in
    a forked device only once it touches it, so a device's first ring cost a page fault per peer
    (~3 µs each, on the critical path of the wake-up wave: 63 at 64 devices).  After the warm-up
    every device has mapped every doorbell; without it, the devices that never rang have not."""
    n = 12
    with VirtualCluster(n, warm_up=warm) as cluster:
        unmapped = cluster.run(_unmapped_doorbells)
    if warm:
        assert unmapped == [0] * n
    else:
        assert sum(unmapped) >= n * (n - 1) // 2, unmapped
