"""The start line of a run (runtime/start_line.py): no device begins a run's function before every
device has been handed it, and the line is not an op.

The reference is a device made late on purpose: its argument takes 0.3 s to load there only, so
without the line the others begin that long before it, and with it they begin after it arrived.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from virtualpar import CollectiveTimeout, DeviceError, VirtualCluster
from virtualpar.errors import InjectedFault

LATE = 0.3  # seconds the late device spends loading the run's argument


class _SlowToLoad:
    """An argument that takes ``LATE`` seconds to unpickle in process ``pid`` (and no time elsewhere)."""

    def __init__(self, pid: int, fail: bool = False) -> None:
        self.pid, self.fail = pid, fail

    def __reduce__(self):
        return _load, (self.pid, self.fail)


def _load(pid: int, fail: bool, seconds: float = LATE) -> str:
    if os.getpid() == pid:
        if fail:
            raise RuntimeError("this argument cannot be loaded here")
        time.sleep(seconds)
    return "loaded"


class _SlowerThanTheTimeout(_SlowToLoad):
    def __init__(self, pid: int, seconds: float) -> None:
        super().__init__(pid)
        self.seconds = seconds

    def __reduce__(self):
        return _load, (self.pid, False, self.seconds)


def _began(dev, arg) -> float:
    return time.monotonic()


@pytest.mark.parametrize("start_line", [True, False])
def test_no_device_begins_before_the_last_one_was_handed_the_run(start_line):
    with VirtualCluster(4, start_line=start_line) as cluster:
        pids = cluster.run(lambda dev: os.getpid())
        began = np.array(cluster.run(_began, _SlowToLoad(pids[2])))
    if start_line:
        assert began.min() > began[2] - LATE / 3  # the others waited for device 2 (woken by it)
    else:
        assert np.delete(began, 2).max() < began[2] - LATE / 3  # they began while it was still loading


def _program(dev):
    dev.barrier()
    dev.all_reduce(np.full(3, float(dev.rank)), group="x")
    return dev.op_seq, dev.clock


def _observed(start_line: bool) -> tuple:
    with VirtualCluster({"x": 2, "y": 2}, start_line=start_line) as cluster:
        runs = [cluster.run(_program) for _ in range(3)]
        traffic = cluster.stats().total_bytes
        events = sorted((e.rank, e.kind, e.name, e.seq, e.model_start, e.model_end, e.nbytes)
                        for e in cluster.trace().events)
        cluster.inject(1, 1, "raise")
        with pytest.raises(InjectedFault, match=r"injected fault on device 1 .* at op #7 \(barrier #4 "):
            cluster.run(_program)
    return runs, traffic, events


def test_the_start_line_is_no_op_moves_nothing_and_leaves_no_trace():
    """Op counts, injected faults, traffic, modelled clocks and trace events: as without it."""
    with_line, without = _observed(True), _observed(False)
    assert with_line == without
    runs, traffic, events = with_line
    assert [ops for ops, _ in runs[2]] == [6] * 4 and traffic > 0 and len(events) == 3 * 2 * 4


def test_a_device_that_cannot_load_the_run_fails_it_at_once_and_the_cluster_recovers():
    with VirtualCluster(4, timeout=30) as cluster:
        pids = cluster.run(lambda dev: os.getpid())
        t0 = time.monotonic()
        with pytest.raises(DeviceError, match="device 2 .*cannot be loaded here"):
            cluster.run(_began, _SlowToLoad(pids[2], fail=True))
        assert time.monotonic() - t0 < 5  # the others, at the start line, were aborted: no op timeout
        assert cluster.run(lambda dev: dev.rank) == [0, 1, 2, 3]


def _barrier_began(dev, arg) -> float:
    began = time.monotonic()
    dev.barrier()
    return began


def test_the_line_only_aligns_a_device_later_than_the_op_timeout_delays_nobody():
    """The others wait the op timeout at the line, then begin: a run that needs nothing of the late
    device still succeeds, and the late one completes the line's fence when it comes, so the
    fences after it (a barrier in the next run) stay in step."""
    with VirtualCluster(4, timeout=0.3) as cluster:
        pids = cluster.run(lambda dev: os.getpid())
        began = np.array(cluster.run(_began, _SlowerThanTheTimeout(pids[2], 1.0)))
        assert np.delete(began, 2).max() < began[2] - 0.3  # they did not wait for device 2 to load
        assert len(set(cluster.run(_barrier_began, None))) == 4
        assert cluster.run(lambda dev: dev.rank) == [0, 1, 2, 3]


def test_a_device_stuck_before_the_line_is_named_by_the_first_op_that_needs_it():
    with VirtualCluster(4, timeout=0.5, abort_grace=0.5) as cluster:
        pids = cluster.run(lambda dev: os.getpid())
        with pytest.raises(CollectiveTimeout, match=r"(?s)missing: device 2.*stack of stuck device 2.*_load"):
            cluster.run(_barrier_began, _SlowerThanTheTimeout(pids[2], 60.0))
