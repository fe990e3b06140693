"""Devices inherit their BLAS limit from the fork (or, spawned, from their environment) instead of
setting it, which starts OpenBLAS's thread pool, whose workers spin ~0.1 s each; the driver gets
its own thread counts and environment back."""

from __future__ import annotations

import os

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from virtualpar import VirtualCluster, blas_threads


class _Lib:
    def __init__(self, threads: int) -> None:
        self.num_threads = threads
        self.sets: list[int] = []

    def set_num_threads(self, n: int) -> None:
        self.sets.append(n)
        self.num_threads = n


@pytest.fixture
def fake_libs(monkeypatch):
    libs = [_Lib(8), _Lib(1)]
    monkeypatch.setattr(blas_threads, "_blas_libs", lambda: libs)
    monkeypatch.setattr(blas_threads, "threads_for", lambda devices: 2)
    monkeypatch.setattr(blas_threads, "_limited", None)
    return libs


def test_a_hold_lowers_the_drivers_threads_until_the_last_release(fake_libs):
    many, one = fake_libs
    first = blas_threads.hold(4)
    assert (many.num_threads, one.num_threads) == (2, 1)  # what a child forked now inherits
    second = blas_threads.hold(4)  # a second cluster, opened before the first closed
    first()
    first()  # (a release is one-shot)
    assert many.num_threads == 2  # the second cluster's devices still share the cores
    second()
    assert (many.num_threads, one.num_threads) == (8, 1)
    assert many.sets == [2, 8] and one.sets == []  # a library already at or below the limit is left alone


def test_the_driver_keeps_the_devices_share_of_blas_while_its_cluster_is_open():
    """Restored right after the fork, the driver's OpenBLAS pool started again and spun ~0.1 s on a
    core the new devices needed (a first 4 KiB ping-pong 16-21 µs one way instead of ~10)."""
    def driver_threads():
        return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]

    before, n = driver_threads(), 2
    share = max(1, len(os.sched_getaffinity(0)) // n)
    with VirtualCluster(n) as c:
        during = driver_threads()
        c.run(lambda dev: None)
    assert during == [min(t, share) for t in before]
    assert driver_threads() == before


def test_a_device_sets_only_a_limit_it_did_not_inherit(fake_libs):
    inherited, other = fake_libs
    inherited.num_threads = 2
    assert blas_threads.limit(4) == 2
    assert inherited.sets == [] and other.sets == [2]


def _threads(dev):
    a = np.ones((256, 256))
    a @ a  # a BLAS call at the device's limit
    blas = [(p["internal_api"], p.get("threading_layer"),
             p["num_threads"]) for p in threadpool_info() if p["user_api"] == "blas"]
    return blas, sorted(os.listdir("/proc/self/task"))


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_devices_at_one_blas_thread_start_no_blas_pool(start_method):
    n = max(4, len(os.sched_getaffinity(0)))  # at least as many devices as cores: one BLAS thread each
    driver = [(p["internal_api"], p["num_threads"]) for p in threadpool_info() if p["user_api"] == "blas"]
    env = os.environ.get("OPENBLAS_NUM_THREADS")
    with VirtualCluster(n, start_method=start_method) as c:
        got = c.run(_threads)
    assert os.environ.get("OPENBLAS_NUM_THREADS") == env  # spawning sets it only while it starts devices
    for blas, tasks in got:
        assert blas and all(threads == 1 for _, _, threads in blas)
        if all(api == "openblas" and layer == "pthreads" for api, layer, _ in blas):
            assert len(tasks) == 2, tasks  # the main thread and the sidecar: no OpenBLAS worker was started
    assert [(p["internal_api"],
             p["num_threads"]) for p in threadpool_info() if p["user_api"] == "blas"] == driver
