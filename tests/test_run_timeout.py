"""``VirtualCluster(run_timeout=...)`` and the prompt error of ``cluster.get`` on a missing key.

A device stuck in its own code, with no peer waiting on it, is bounded by no op timeout: only the
whole-run deadline catches it.  These tests check that it arrives as ``RunTimeout`` naming the
devices still running, with their last op and a stack line from the function they are stuck in;
that the cluster is shut down and leaves nothing behind (``no_leaks``); and that ``None`` really
means no limit.  Op timeouts are 30 s, so an error within ``BOUND`` seconds can only come from the
run deadline.  Device functions live at module level: ``fork`` pickles them by reference.
"""

from __future__ import annotations

import pickle
import time

import numpy as np
import pytest

import virtualpar
from virtualpar import VirtualCluster
from virtualpar.errors import ClusterClosedError, DeviceError, RunTimeout, UsageError, VirtualParError

from ._timing import raises_within
from virtualpar.testing.leaks import process_alive

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(60)]

OP_TIMEOUT = 30.0  # far above every run_timeout here: the run deadline must be what fires
BOUND = 10.0  # a RunTimeout must reach the driver within this many seconds


# -- functions run on the devices -------------------------------------------------------------------

def sleep_on_rank_1(dev):
    """Rank 1 is stuck in user code; nobody waits on it (every other device returns at once)."""
    if dev.rank == 1:
        time.sleep(60)
    return dev.rank


def sleep_then_all_reduce(dev):
    """Rank 1 sleeps while its peers wait for it inside an all_reduce (op timeout far away)."""
    if dev.rank == 1:
        time.sleep(60)
    return dev.all_reduce(np.ones(3) * dev.rank)


def sleep_on_rank_0(dev, seconds):
    if dev.rank == 0:
        time.sleep(seconds)
    return dev.rank


def raise_on_0_sleep_on_1(dev):
    """Rank 0 fails at once; rank 1 is in user code, where the abort cannot reach it."""
    if dev.rank == 0:
        raise ValueError("the real root cause")
    if dev.rank == 1:
        time.sleep(60)
    return dev.rank


def rank_of(dev):
    return dev.rank


# -- run_timeout --------------------------------------------------------------------------------------

def test_run_timeout_names_the_stuck_device_kills_it_and_closes_the_cluster():
    with VirtualCluster(3, timeout=OP_TIMEOUT, run_timeout=1.0) as c:
        stuck_pid = c.pids[1]
        with raises_within(RunTimeout) as info:
            c.run(sleep_on_rank_1)
        err = info.value
        msg = str(err)
        assert isinstance(err, TimeoutError) and isinstance(err, VirtualParError)
        assert err.running == [1] and err.run_timeout == 1.0 and err.function == "sleep_on_rank_1"
        assert (
            "sleep_on_rank_1() did not finish within run_timeout=1 s; still running: device 1 (world=1)"
            in msg
        )
        # the last op, from the flight recorder: the run itself, started and never finished
        assert "run sleep_on_rank_1() [user code]" in err.last_ops[1] and "not finished" in err.last_ops[1]
        assert "device 1 (world=1) last op: " + err.last_ops[1] in msg
        # the stack, from the sidecar: the line it sleeps on, in the function it sleeps in
        assert "in sleep_on_rank_1" in err.stacks[1] and "time.sleep(60)" in err.stacks[1]
        assert "time.sleep(60)" in msg and "devices [0, 2] had returned" in msg
        assert set(err.stacks) == {1}
        assert not process_alive(stuck_pid)
        assert c.closed
        with pytest.raises(ClusterClosedError, match="run_timeout"):
            c.run(rank_of)
    # the flight recorder outlives the cluster
    assert "run sleep_on_rank_1() [user code]" in c.flight_records(1)[-1].text


def test_run_timeout_reports_every_device_still_running():
    with VirtualCluster(3, timeout=OP_TIMEOUT, run_timeout=1.0) as c:
        with raises_within(RunTimeout) as info:
            c.run(sleep_then_all_reduce)
        err = info.value
        assert err.running == [0, 1, 2] and set(err.stacks) == {0, 1, 2}
        assert "time.sleep(60)" in err.stacks[1]
        for r in (0, 2):  # the peers wait for device 1 inside the collective
            assert "all_reduce #1" in err.last_ops[r] and "not finished" in err.last_ops[r]
            assert "in sleep_then_all_reduce" in err.stacks[r] and "all_reduce" in err.stacks[r]
        assert "had returned" not in str(err)
        assert c.closed


def test_a_failure_before_the_deadline_stays_the_root_cause():
    # abort_grace (30 s) outlasts run_timeout (1 s): the deadline cuts the grace short, but the error
    # raised is still the first failure, with the device that had to be killed reported as stuck
    with VirtualCluster(3, timeout=OP_TIMEOUT, run_timeout=1.0, abort_grace=30.0) as c:
        with raises_within(DeviceError) as info:
            c.run(raise_on_0_sleep_on_1)
        assert not isinstance(info.value, RunTimeout)
        assert info.value.rank == 0 and "the real root cause" in str(info.value)
        with pytest.raises(ClusterClosedError, match=r"devices \[1\] were stuck"):
            c.run(rank_of)


def test_no_run_timeout_lets_long_user_code_finish():
    with VirtualCluster(2, timeout=OP_TIMEOUT) as c:
        assert c.run_timeout is None
        assert c.run(sleep_on_rank_0, 1.5) == [0, 1]
        assert not c.closed


def test_run_timeout_bounds_each_run_not_their_sum():
    with VirtualCluster(2, timeout=OP_TIMEOUT, run_timeout=1.5) as c:
        for _ in range(3):  # 3 x 0.5 s exceeds 1.5 s in total, never in one run
            assert c.run(sleep_on_rank_0, 0.5) == [0, 1]
        assert c.run(rank_of) == [0, 1]


@pytest.mark.parametrize("bad", [0, -1.0, "1", True])
def test_run_timeout_must_be_positive_seconds_or_none(bad):
    with pytest.raises(UsageError, match=f"run_timeout must be positive seconds or None.*got {bad!r}"):
        VirtualCluster(2, run_timeout=bad)


def test_run_timeout_error_pickles_and_is_exported():
    err = RunTimeout("f() did not finish", running=[1], last_ops={1: "op #0 run f()"}, stacks={1: "  File x"},
                     run_timeout=1.0, function="f")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is RunTimeout and str(back) == "f() did not finish"
    assert (back.running, back.last_ops, back.stacks,
            back.run_timeout) == ([1], {1: "op #0 run f()"}, {1: "  File x"}, 1.0)
    assert virtualpar.RunTimeout is RunTimeout and "RunTimeout" in virtualpar.__all__
    assert "RunTimeout" in virtualpar.errors.__all__


# -- get of a missing key -----------------------------------------------------------------------------

def test_get_of_a_missing_key_raises_promptly_and_the_cluster_recovers():
    with VirtualCluster(2, timeout=OP_TIMEOUT) as c:
        c.put(1, "w", np.arange(3.0))
        # 24 in a row take milliseconds.  Before the device rang the host's doorbell, a get whose
        # error reply lost the race with the driver's first look at the pipe waited out the driver's
        # 0.5 s wake slice: about every other one here (some 6 s in all), so the bound catches that.
        t0 = time.monotonic()
        for _ in range(24):
            with pytest.raises(UsageError) as info:
                c.get(1, "missing-key")
        assert time.monotonic() - t0 < 5.0
        err = info.value
        assert err.rank == 1
        assert "device 1 (world=1)" in str(err) and "'missing-key'" in str(err) and "['w']" in str(err)
        np.testing.assert_array_equal(c.get(1, "w"), np.arange(3.0))
        assert c.run(rank_of) == [0, 1]
