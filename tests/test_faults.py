"""The fault suite: every way a virtual cluster can go wrong ends, within seconds, in an error that
names the device(s) and the op, and leaves no process, fd, thread or /dev/shm entry behind.

Every test runs under the ``no_leaks`` fixture (tests/conftest.py).  Op timeouts are 2 s; each
failure must arrive within ``BOUND`` seconds (an upper bound on a failure path, so generous).
Functions run on devices live at module level: ``fork`` pickles them by reference.
"""

from __future__ import annotations

import os
import pickle
import re
import select
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import virtualpar
from virtualpar import Mesh, Topology, VirtualCluster
from virtualpar.errors import (ClusterClosedError, CollectiveMismatch, CollectiveTimeout, DeviceAborted,
                               DeviceDied, DeviceError, InjectedFault, MeshError, NonFiniteError, P2PTimeout,
                               PayloadError, RemoteTraceback, ShardingError, UnmatchedMessages, UsageError,
                               VirtualParError)
from virtualpar.testing.leaks import Snapshot, leaks, own_segments, process_alive, segments

from ._timing import raises_within

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(60)]

T = 2.0  # op timeout of every fault-test cluster
BOUND = 10.0  # a failure must reach the driver within this many seconds
HERE = os.path.dirname(os.path.abspath(__file__))




def cluster(n=4, **kw) -> VirtualCluster:
    kw.setdefault("timeout", T)
    kw.setdefault("detect_deadlocks", False)  # these tests exercise the timeouts, the backstop of detection
    return VirtualCluster(n, **kw)


# -- functions run on the devices (module level: fork pickles them by reference) ----------------------

def x_of(dev, n=4):
    return np.arange(n, dtype=np.float64) + dev.rank


def allreduce_sum(n_dev, n=4):
    """sum over r of (arange(n) + r): the numpy reference of all_reduce(x_of(dev))."""
    return n_dev * np.arange(n, dtype=np.float64) + n_dev * (n_dev - 1) / 2


def two_allreduces(dev):
    a = dev.all_reduce(x_of(dev))
    return dev.all_reduce(a / dev.size)


def raise_mid_collective(dev, culprit=2):
    dev.all_reduce(x_of(dev))
    if dev.rank == culprit:
        raise ValueError("boom on purpose")
    return dev.all_reduce(x_of(dev))


def raise_late(dev):
    """The culprit raises after its peers are already blocked inside the collective."""
    if dev.rank == 2:
        time.sleep(0.3)
        raise ValueError("late boom")
    return dev.all_reduce(x_of(dev))


def wrap_aborts(dev):
    """Peers that turn the abort into their own error must still not hide the root cause."""
    if dev.rank == 2:
        time.sleep(0.3)
        raise ValueError("the real root cause")
    try:
        return dev.all_reduce(x_of(dev))
    except Exception as exc:
        raise RuntimeError(f"wrapped on device {dev.rank}") from exc


def exit_mid_collective(dev):
    dev.all_reduce(x_of(dev))
    if dev.rank == 1:
        os._exit(5)
    return dev.all_reduce(x_of(dev))


def sleep_before_collective(dev):
    dev.all_reduce(x_of(dev))
    if dev.rank == 0:
        time.sleep(60)  # a device stuck in user code: ignores aborts, must be killed
    return dev.all_reduce(x_of(dev))


def kill_peer_mid_collective(dev, victim_pid):
    """Device 0 SIGKILLs device 1 from outside while devices 0, 2, 3 wait in a collective."""
    if dev.rank == 1:
        time.sleep(30)
    if dev.rank == 0:
        os.kill(victim_pid, signal.SIGKILL)
    return dev.all_reduce(x_of(dev))


def exit_at_once(args, arena=None):
    """Replaces device_main in the start-up failure test: the device dies before its handshake."""
    os._exit(4)


def mismatched(dev, case):
    x = np.ones((4, 8), np.float32)
    odd = dev.rank == 2
    if case == "collective":
        return dev.all_gather(x) if odd else dev.all_reduce(x)
    if case == "shape":
        return dev.all_reduce(np.ones((4, 9) if odd else (4, 8), np.float32))
    if case == "dtype":
        return dev.all_reduce(x.astype(np.float64) if odd else x)
    if case == "op":
        return dev.all_reduce(x, op="max" if odd else "sum")
    if case == "root":
        return dev.broadcast(x, root=1 if odd else 0)
    if case == "dim":
        return dev.all_gather(x, dim=1 if odd else 0)
    raise AssertionError(case)


def skip_second(dev, timeout=None):
    dev.all_reduce(x_of(dev))
    if dev.rank == 3:
        return None  # skips the second collective
    return dev.all_reduce(x_of(dev), timeout=timeout)


def send_unmatched(dev):
    if dev.rank == 0:
        dev.send(np.arange(3.0), 1, tag=5)
    return dev.rank


def recv_unsent(dev, timeout=None):
    if dev.rank == 1:
        return dev.recv(0, tag=3, timeout=timeout)
    return None


def bad_group(dev):
    return dev.all_reduce(np.ones(2), group="pp")


def non_array(dev):
    return dev.all_reduce([1.0, 2.0])


def send_unpicklable(dev):
    if dev.rank == 0:
        dev.send(threading.Lock(), 1)


def recv_wrong_buffer(dev, shape, dtype):
    if dev.rank == 0:
        dev.send(np.arange(4.0), 1)
        return None
    if dev.rank == 1:
        return dev.recv(0, out=np.empty(shape, dtype))
    return None


def bad_root(dev, root):
    return dev.broadcast(np.ones(2), root=root)


def bad_dst(dev, dst):
    if dev.rank == 1:
        dev.send(np.ones(2), dst)


def nan_on_2(dev):
    x = np.ones(4)
    if dev.rank == 2:
        x[1] = np.nan
    return dev.all_reduce(x)


def return_lambda(dev):
    return lambda: dev.rank


def identity(dev, *args):
    return args


def rank_of(dev):
    return dev.rank


def solo_collectives(dev):
    x = np.arange(6.0).reshape(2, 3)
    dev.barrier()
    return [dev.all_reduce(x), dev.all_gather(x), dev.broadcast(x), dev.reduce_scatter(x), dev.reduce(x),
            dev.gather(x), dev.scatter(x), dev.all_to_all(x)]


def ring_of_one(dev):
    """Generic ring code at world size 1: every message goes to oneself, as MPI allows."""
    right, left = (dev.rank + 1) % dev.size, (dev.rank - 1) % dev.size
    req = dev.irecv(left, tag=3)  # posted before the send, like MPI's Irecv/Isend pair
    dev.send(np.arange(3.0), right, tag=3)
    got = req.wait()
    also = dev.sendrecv({"k": 1}, right, left, sendtag=4)
    return got, also


def recv_from_self_with_nothing_sent(dev):
    dev.recv(dev.rank, tag=9)


def mesh_step(dev):
    """On a dp=2 x tp=4 mesh: all_reduce over tp, then all_gather over dp."""
    y = dev.all_reduce(x_of(dev), group="tp")
    return dev.all_gather(y[None, :], group="dp")


def mesh_step_reference(mesh):
    """Per rank: one row per dp-peer q, holding the sum over q's tp group of (arange(4) + rank)."""
    def tp_sum(q):
        return sum(np.arange(4.0) + p for p in mesh.group_of(q, ("tp",)))

    return [np.stack([tp_sum(q) for q in mesh.group_of(r, ("dp",))]) for r in range(mesh.size)]


# -- a device raises ------------------------------------------------------------------------------

def test_device_raises_mid_collective_then_cluster_recovers():
    # a 30 s op timeout: arriving within BOUND proves the peers were woken by the abort, not by a timeout
    with cluster(4, timeout=30.0) as c:
        with raises_within(DeviceError) as info:
            c.run(raise_mid_collective)
        err = info.value
        msg = str(err)
        assert "device 2 (world=2)" in msg and "ValueError" in msg and "boom on purpose" in msg
        assert "op #1" in msg and "all_reduce" in msg  # the last op the device started
        assert (err.rank, err.index, err.op_seq, err.exc_type) == (2, "(world=2)", 1, "ValueError")
        assert isinstance(err.__cause__, RemoteTraceback) and "boom on purpose" in err.__cause__.tb
        # recoverable: the same cluster runs the next function correctly
        for got in c.run(two_allreduces):
            np.testing.assert_allclose(got, allreduce_sum(4))


def test_injected_raise_names_device_and_op():
    with cluster(4) as c:
        c.inject(3, at_op=2, action="raise")
        with raises_within(InjectedFault) as info:
            c.run(two_allreduces)
        msg = str(info.value)
        assert "device 3 (world=3)" in msg and "op #2" in msg and "all_reduce #2" in msg
        assert info.value.rank == 3 and info.value.op_seq == 2
        assert c.run(rank_of) == [0, 1, 2, 3]


def test_injected_delay_is_harmless():
    with cluster(4) as c:
        c.inject(1, at_op=1, action="delay", seconds=0.2)
        for got in c.run(two_allreduces):
            np.testing.assert_allclose(got, allreduce_sum(4))


def test_secondary_aborts_never_hide_the_root_cause():
    with cluster(4) as c:
        with raises_within(DeviceError) as info:
            c.run(raise_late)
        assert info.value.rank == 2 and "late boom" in str(info.value)
        assert not isinstance(info.value, DeviceAborted)
        with raises_within(DeviceError) as info:
            c.run(wrap_aborts)
        assert info.value.rank == 2 and "the real root cause" in str(info.value), str(info.value)
        assert c.run(rank_of) == [0, 1, 2, 3]


# -- a device dies ----------------------------------------------------------------------------------

def test_device_killed_mid_collective_is_fatal():
    c = cluster(4, timeout=30.0)  # see test_device_raises_mid_collective_then_cluster_recovers
    with c:
        pid = c.pids[1]
        c.inject(1, at_op=2, action="kill")
        with raises_within(DeviceDied) as info:
            c.run(two_allreduces)
        err = info.value
        msg = str(err)
        assert "device 1 (world=1)" in msg and "SIGKILL" in msg and "all_reduce #2" in msg and "op #2" in msg
        assert (err.rank, err.exitcode, err.signal) == (1, -signal.SIGKILL, "SIGKILL")
        assert "op #2" in err.last_op and "all_reduce" in err.last_op
        assert not process_alive(pid)
        assert c.closed
        with pytest.raises(ClusterClosedError, match="fatal failure"):
            c.run(rank_of)
    # the flight recorder outlives the device and the cluster
    records = c.flight_records(1)
    assert records[-1].seq == 2 and records[-1].state == "started" and "all_reduce #2" in records[-1].text


def test_device_killed_from_outside_while_peers_wait():
    with cluster(4, timeout=30.0) as c:
        with raises_within(DeviceDied) as info:
            c.run(kill_peer_mid_collective, c.pids[1])
        assert info.value.rank == 1 and info.value.signal == "SIGKILL"
        assert "device 1 (world=1)" in str(info.value) and "during kill_peer_mid_collective" in str(
            info.value
        )
        with pytest.raises(ClusterClosedError):
            c.run(rank_of)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_device_killed_while_idle(start_method):
    with cluster(3, start_method=start_method) as c:
        assert c._arena.name not in segments()  # unlinked as soon as every device mapped it
        c.clocks()  # idle: the start-up warm-up is over (one killed in it: tests/test_warmup.py)
        os.kill(c.pids[1], signal.SIGKILL)
        assert wait_gone([c.pids[1]], 2.0) == []
        with raises_within(DeviceDied) as info:
            c.run(rank_of)  # spawn: the pipe to device 1 is broken; fork: its sentinel fires
        assert info.value.rank == 1 and info.value.signal == "SIGKILL" and "no op started" in str(info.value)
        with pytest.raises(ClusterClosedError):
            c.put(0, "x", np.ones(1))


def test_start_up_failure_leaks_nothing(monkeypatch):
    import multiprocessing.process
    import virtualpar.runtime.cluster as cluster_module

    monkeypatch.setattr(cluster_module, "device_main", exit_at_once)
    with raises_within(DeviceDied) as info:
        cluster(3)
    assert "exited with code 4 during start-up" in str(info.value)
    monkeypatch.undo()

    real_start, started = multiprocessing.process.BaseProcess.start, []

    def start_twice_then_fail(proc):
        if len(started) == 2:
            raise OSError("fork failed on purpose")
        started.append(proc)
        real_start(proc)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start_twice_then_fail)
    with pytest.raises(OSError, match="fork failed on purpose"):
        cluster(4)


@pytest.mark.parametrize("how", ["inject", "user code"])
def test_device_exits_early_while_peers_wait(how):
    with cluster(4) as c:
        if how == "inject":
            c.inject(1, at_op=2, action="exit", code=7)
            fn, code = two_allreduces, 7
        else:
            fn, code = exit_mid_collective, 5
        with raises_within(DeviceDied) as info:
            c.run(fn)
        err = info.value
        assert f"exited with code {code}" in str(err) and "device 1 (world=1)" in str(err)
        assert (err.rank, err.exitcode, err.signal) == (1, code, None)
        assert "op #" in err.last_op
        with pytest.raises(ClusterClosedError):
            c.run(rank_of)


# -- a device hangs ---------------------------------------------------------------------------------

def test_device_hangs_inside_collective():
    with cluster(4, abort_grace=1.0) as c:
        c.inject(0, at_op=2, action="hang")
        with raises_within(CollectiveTimeout) as info:
            c.run(two_allreduces)
        err = info.value
        msg = str(err)
        assert "all_reduce #2 on world=(0,1,2,3)" in msg and "did not complete within 2 s" in msg
        assert re.search(r"on device [123] \(world=[123]\) \(op #2\)", msg), msg
        assert "stack of stuck device 0" in msg and "_fire" in err.stacks[0]
        assert set(err.flight_records) == {0, 1, 2, 3}
        assert err.flight_records[0][-1].state == "started"
        with pytest.raises(ClusterClosedError, match="stuck"):
            c.run(rank_of)


def test_device_hangs_in_user_code_reports_missing_device_and_its_stack():
    with cluster(4, abort_grace=1.0) as c:
        with raises_within(CollectiveTimeout) as info:
            c.run(sleep_before_collective)
        err = info.value
        assert err.missing == [0] and err.reached == [1, 2, 3]
        assert "reached: device 1, device 2, device 3; missing: device 0" in str(err)
        assert "sleep_before_collective" in err.stacks[0] and "time.sleep(60)" in err.stacks[0]
        assert "last ops" in str(err) and "all_reduce #1" in str(err)  # device 0's flight record
        with pytest.raises(ClusterClosedError):
            c.run(rank_of)


# -- the collective contract check ------------------------------------------------------------------

@pytest.mark.parametrize("case, differs", [
    ("collective", ["collective"]),
    ("shape", ["shape"]),
    ("dtype", ["dtype"]),
    ("op", ["op"]),
    ("root", ["root"]),
    ("dim", ["dim"]),
])
def test_collective_mismatch(case, differs):
    with cluster(4) as c:
        with raises_within(CollectiveMismatch) as info:
            c.run(mismatched, case)
        err = info.value
        msg = str(err)
        assert err.differs == differs, msg
        assert f"differs in: {', '.join(differs)}" in msg
        lines = [ln for ln in msg.splitlines() if re.match(r"\s*device \d \(world=\d\) called ", ln)]
        assert len(lines) == 4, msg  # one line per device
        assert "#1 on group world=(0,1,2,3)" in msg and "op #1" in msg
        assert all(err.calls[r] != err.calls[2] for r in (0, 1, 3))  # device 2 is the odd one out
        assert set(err.flight_records) == {0, 1, 2, 3}
        assert err.index == str(c.mesh.index(err.rank))  # the plugin's report header shows it
        # recoverable
        assert c.run(rank_of) == [0, 1, 2, 3]


def test_mismatch_message_shows_each_call():
    with cluster(4) as c:
        with pytest.raises(CollectiveMismatch) as info:
            c.run(mismatched, "collective")
        msg = str(info.value)
        assert "device 0 (world=0) called all_reduce(shape=(4, 8), float32, op=sum" in msg
        assert "device 2 (world=2) called all_gather(shape=(4, 8), float32, dim=0" in msg


def test_one_device_skips_a_collective():
    with cluster(4) as c:
        # earlier runs leave records of "all_reduce #2 on world=(0,1,2,3)" on every device (the group
        # numbering restarts after the failed run): they must not count as reaching this one
        c.run(two_allreduces)
        with pytest.raises(CollectiveMismatch):
            c.run(mismatched, "dtype")
        with raises_within(CollectiveTimeout) as info:
            c.run(skip_second)
        err = info.value
        assert err.missing == [3] and err.reached == [0, 1, 2]
        assert "all_reduce #2 on world=(0,1,2,3)" in str(err) and "missing: device 3" in str(err)
        assert "device 3 (world=3) last ops" in str(err)
        assert c.run(rank_of) == [0, 1, 2, 3]  # nobody was stuck: recoverable


def test_per_call_timeout_overrides_the_cluster_default():
    with cluster(4, timeout=30.0) as c:
        with raises_within(CollectiveTimeout, bound=10.0) as info:
            c.run(skip_second, 0.5)
        assert "within 0.5 s" in str(info.value)
        with raises_within(P2PTimeout, bound=10.0) as info:
            c.run(recv_unsent, 0.5)
        assert "within 0.5 s" in str(info.value)


# -- point to point ---------------------------------------------------------------------------------

def test_send_with_no_matching_recv_is_reported():
    with cluster(3) as c:
        with raises_within(UnmatchedMessages) as info:
            c.run(send_unmatched)
        err = info.value
        assert err.messages == [(0, 1, 5, "array(3,) float64")]
        assert "device 0 -> device 1, tag 5" in str(err)
        assert c.run(rank_of) == [0, 1, 2]


def test_recv_with_no_send_times_out():
    with cluster(3) as c:
        with raises_within(P2PTimeout) as info:
            c.run(recv_unsent)
        err = info.value
        msg = str(err)
        assert "device 1 (world=1): recv from device 0 (tag 3)" in msg and "op #1" in msg
        assert (err.rank, err.peer, err.tag, err.op_seq) == (1, 0, 3, 1)
        mine = err.flight_records[1][-1]  # taken at the moment it timed out
        assert set(err.flight_records) == {0,
                                           1} and mine.state == "started" and mine.text == "recv from 0 tag=3"
        assert c.run(rank_of) == [0, 1, 2]


# -- bad input to the API ---------------------------------------------------------------------------

def test_wrong_group_axis_names_the_device():
    with cluster(Mesh({"dp": 2, "tp": 2})) as c:
        with raises_within(MeshError) as info:
            c.run(bad_group)
        err = info.value
        assert isinstance(err, ValueError)
        assert f"device {err.rank} " in str(err) and "'pp'" in str(err) and "('dp', 'tp')" in str(err)
        assert c.run(rank_of) == [0, 1, 2, 3]


def test_mesh_shape_not_matching_the_device_count():
    with pytest.raises(MeshError, match="holds 4 devices, but its topology"):
        Mesh({"dp": 2, "tp": 2}, topology=Topology.fully_connected(3))
    with pytest.raises(MeshError, match="holds 6 devices, but 4 were asked for"):
        Mesh.for_devices(4, {"dp": 2, "tp": 3})
    with pytest.raises(UsageError, match="3 devices but the mesh"):
        VirtualCluster(Mesh({"dp": 2, "tp": 2}), hardware=Topology.fully_connected(3))
    with pytest.raises(MeshError):
        VirtualCluster({"dp": 0})


def test_non_array_payload_to_a_collective():
    with cluster(2) as c:
        with raises_within(PayloadError) as info:
            c.run(non_array)
        err = info.value
        assert isinstance(err, TypeError)
        assert f"device {err.rank} " in str(err) and "all_reduce" in str(err) and "got list" in str(err)


def test_unpicklable_payload_to_send():
    with cluster(2) as c:
        with raises_within(PayloadError) as info:
            c.run(send_unpicklable)
        err = info.value
        assert err.rank == 0 and "device 0 (world=0)" in str(err) and "lock" in str(err)
        assert "op #1" in str(err)
        assert c.run(rank_of) == [0, 1]


def test_unpicklable_result_and_argument():
    with cluster(2) as c:
        with raises_within(PayloadError) as info:
            c.run(return_lambda)
        assert "result of return_lambda() cannot be sent to the driver" in str(info.value)
        assert f"device {info.value.rank} " in str(info.value)
        with pytest.raises(PayloadError, match=r"cannot send argument 0 \(lock\) of identity\(\)"):
            c.run(identity, threading.Lock())
        assert c.run(identity, 1) == [(1,), (1,)]


@pytest.mark.parametrize("shape, dtype", [((5,), np.float64), ((4,), np.float32), ((2, 2), np.float64)])
def test_recv_buffer_of_the_wrong_shape_or_dtype(shape, dtype):
    with cluster(2) as c:
        with raises_within(UsageError) as info:
            c.run(recv_wrong_buffer, shape, dtype)
        err = info.value
        assert err.rank == 1 and "device 1 (world=1)" in str(err)
        assert f"shape {shape}" in str(err) and "holds shape (4,) and dtype float64" in str(err)
        assert c.run(rank_of) == [0, 1]


@pytest.mark.parametrize("root", [-1, 4, 1.5, True])
def test_bad_root(root):
    with cluster(4) as c:
        with raises_within(UsageError) as info:
            c.run(bad_root, root)
        err = info.value
        assert f"device {err.rank} " in str(err) and f"root={root!r}" in str(err) and "broadcast" in str(err)
        assert c.run(rank_of) == [0, 1, 2, 3]


@pytest.mark.parametrize("dst, what",
                         [(-1, "out of range"), (4, "out of range"), ("0", "must be a device rank")])
def test_bad_dst(dst, what):
    with cluster(4) as c:
        with raises_within(UsageError) as info:
            c.run(bad_dst, dst)
        err = info.value
        assert err.rank == 1 and "device 1 (world=1)" in str(err) and what in str(err)


def test_nan_input_with_the_check_on():
    with cluster(4, check_nan=True) as c:
        with raises_within(NonFiniteError) as info:
            c.run(nan_on_2)
        err = info.value
        assert isinstance(err, FloatingPointError)
        msg = str(err)
        assert "device 2 (world=2)" in msg and "all_reduce #1" in msg and "op #1" in msg and "1 NaN" in msg
        assert (err.rank, err.op, err.op_seq) == (2, "all_reduce", 1)
        assert c.run(rank_of) == [0, 1, 2, 3]
    with cluster(2, check_nan=False) as c:  # off: NaN flows through like any number
        assert all(np.isnan(r[1]) for r in c.run(nan_on_2_of_2))


def nan_on_2_of_2(dev):
    x = np.ones(4)
    if dev.rank == 1:
        x[1] = np.nan
    return dev.all_reduce(x)


def test_lambdas_and_closures_run_under_spawn_and_bad_arguments_are_named():
    import threading

    offset = 10

    def local_closure(dev, *args, **kwargs):
        return dev.rank + offset

    with cluster(2, start_method="spawn") as c:
        t0 = time.monotonic()
        assert c.run(lambda dev: dev.rank * 2) == [0, 2]
        assert c.run(local_closure) == [10, 11]
        with pytest.raises(PayloadError, match=r"argument 1 \(lock\) of .*local_closure"):
            c.run(local_closure, 1, threading.Lock())
        with pytest.raises(PayloadError, match=r"keyword argument guard= \(lock\)"):
            c.run(local_closure, guard=threading.Lock())
        assert time.monotonic() - t0 < BOUND
        assert c.run(rank_of) == [0, 1]


def test_bad_fault_injection_arguments():
    with cluster(2) as c:
        with pytest.raises(UsageError, match="unknown fault action"):
            c.inject(0, at_op=1, action="explode")
        with pytest.raises(UsageError, match="at_op"):
            c.inject(0, at_op=0, action="raise")
        with pytest.raises(UsageError, match="rank must be"):
            c.inject(2, at_op=1, action="raise")
        with pytest.raises(UsageError, match=r"'delay' takes \['seconds'\], not \['secs'\]"):
            c.inject(1, at_op=1, action="delay", secs=1)  # was the default 1 s, silently


def _two_barriers(dev):
    dev.barrier()
    dev.barrier()
    return dev.rank


def test_a_fault_its_run_never_reaches_fails_that_run_not_a_later_one():
    """A fault at op 3 of a run of 2 ops stayed armed, and fired in whatever the device ran next —
    with a module-scoped cluster, in another test."""
    with cluster(2) as c:
        c.inject(0, at_op=3, action="raise")
        with pytest.raises(UsageError,
                           match="a fault injected at op 3 of this run did not fire: the run ended "
                                             "after 2 ops"):
            c.run(_two_barriers)
        assert c.run(_two_barriers) == [0, 1]  # nothing left armed
        c.inject(1, at_op=2, action="raise")
        assert c.run(rank_of) == [0, 1]  # a run without ops (an operation's set-up) leaves it for the next
        with pytest.raises(InjectedFault, match="at op #"):
            c.run(_two_barriers)


# -- host <-> device channel ------------------------------------------------------------------------

def test_host_channel_keys_are_names():
    """put(0, ["x"], 1) failed on the device as "unhashable type" in virtualpar code."""
    with cluster(2) as c:
        for call in (lambda: c.put(0, ["x"], 1), lambda: c.put(0, 5, 1, block=False),
                     lambda: c.get(1, ("k",))):
            with pytest.raises(UsageError,
                               match=r"cluster\.(put|get): key must be a str \(a name in dev\.state\)"):
                call()
        c.put(0, "x", 1)
        assert c.get(0, "x") == 1


def test_put_get_survive_errors():
    with cluster(2) as c:
        with raises_within(UsageError) as info:  # the caller's mistake, named as such
            c.get(1, "missing")
        assert str(info.value).startswith("cluster.get(1, 'missing'): device 1")
        with raises_within(PayloadError):
            c.put(0, "lock", threading.Lock())
        c.put(1, "w", np.arange(5.0))
        np.testing.assert_array_equal(c.get(1, "w"), np.arange(5.0))
        assert c.run(rank_of) == [0, 1]


# -- lifecycle --------------------------------------------------------------------------------------

def test_use_after_close():
    c = cluster(2)
    c.close()
    for call in (lambda: c.run(rank_of), lambda: c.put(0, "k", np.ones(1)), lambda: c.get(0, "k"),
                 lambda: c.inject(0, 1, "raise"), c.stats, c.reset_stats, c.clocks, c.trace, c.clear_trace):
        with pytest.raises(ClusterClosedError, match="closed"):
            call()


def test_double_close():
    c = cluster(2)
    with c:
        assert c.run(rank_of) == [0, 1]
    assert c.closed
    c.close()
    c.close()


def test_close_frees_memory_and_fds_without_waiting_for_gc():
    before = Snapshot.take()
    c = cluster(4)
    c.run(two_allreduces)
    c.close()
    assert leaks(before, settle=0.0) == []  # while `c` is still referenced
    maps = open("/proc/self/maps").read()
    assert c._arena.name not in maps


def test_devices_ignore_sigint():
    with cluster(2) as c:
        for pid in c.pids:
            os.kill(pid, signal.SIGINT)
        assert c.run(rank_of) == [0, 1]


def test_world_size_1():
    with cluster(1) as c:
        x = np.arange(6.0).reshape(2, 3)
        for got in c.run(solo_collectives)[0]:
            np.testing.assert_array_equal(got, x)
        got, also = c.run(ring_of_one)[0]
        np.testing.assert_array_equal(got, np.arange(3.0))
        assert also == {"k": 1}
        with raises_within(UsageError, bound=2.0) as info:
            c.run(recv_from_self_with_nothing_sent)
        assert "device 0 (world=0)" in str(info.value) and "recv from itself (tag 9)" in str(info.value)
        with raises_within(DeviceError, bound=2.0):
            c.run(raise_mid_collective, 0)
        assert c.run(rank_of) == [0]
        c.inject(0, at_op=1, action="kill")
        with raises_within(DeviceDied):
            c.run(two_allreduces)


def test_eight_devices_on_two_cores():
    mesh = Mesh({"dp": 2, "tp": 4})
    with cluster(mesh) as c:
        expected = mesh_step_reference(mesh)
        for _ in range(3):
            for got, want in zip(c.run(mesh_step), expected):
                np.testing.assert_allclose(got, want)
        with raises_within(DeviceError) as info:
            c.run(raise_mid_collective, 5)
        assert "device 5 (dp=1, tp=1)" in str(info.value)
        with raises_within(CollectiveMismatch):
            c.run(mismatched, "shape")
        for got, want in zip(c.run(mesh_step), expected):
            np.testing.assert_allclose(got, want)


def _counts():
    s = Snapshot.take()
    return len(s.children), len(s.fds), len(s.threads), len(own_segments())


def _cycle(i):
    with cluster(2 + i % 3) as c:
        if i % 10 == 9:
            c.inject(0, at_op=1, action="raise")
            with pytest.raises(InjectedFault):
                c.run(two_allreduces)
        for got in c.run(two_allreduces):
            np.testing.assert_allclose(got, allreduce_sum(c.size))


def test_fifty_clusters_in_a_loop_leave_counts_flat():
    _cycle(0)
    base = _counts()
    for i in range(50):
        _cycle(i)
        if i in (9, 29, 49):
            assert _counts() == base, f"after {i + 1} clusters"


@pytest.mark.soak
@pytest.mark.timeout(600)
def test_soak_1000_cluster_cycles():
    _cycle(0)
    base = _counts()
    for i in range(1000):
        _cycle(i)
        if i % 100 == 99:
            assert _counts() == base, f"after {i + 1} clusters"


# -- the driver dies or is interrupted (driver in a subprocess) --------------------------------------

def _start_driver(start_method: str, n: int) -> tuple[subprocess.Popen, list[int], str]:
    """Start tests/_driver_scripts.py; return once its devices are inside ``cluster.run``."""
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "_driver_scripts.py"), start_method, str(n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    fd = proc.stdout.fileno()
    pids: list[int] = []
    shm, text = "", ""
    deadline = time.monotonic() + 30
    while "running" not in text and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 4096).decode() if ready else ""
        if not chunk:
            break
        text += chunk
    for line in text.splitlines():
        if line.startswith("pids"):
            pids = [int(p) for p in line.split()[1:]]
        elif line.startswith("shm"):
            shm = line.split()[1]
    if "running" not in text:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the driver did not start its run: {text}\n{err.decode()}")
    return proc, pids, shm


def wait_gone(pids: list[int], within: float) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in pids if process_alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if process_alive(p)]


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_ctrl_c_in_the_driver_reaps_devices_and_reraises(start_method):
    proc, pids, shm = _start_driver(start_method, 3)
    try:
        assert len(pids) == 3 and all(process_alive(p) for p in pids)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # like Ctrl-C in a terminal: the whole process group
        _, err = proc.communicate(timeout=5.0)
        err = err.decode()
        assert time.monotonic() - t0 < 5.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGINT, err
    assert err.rstrip().endswith("KeyboardInterrupt"), err
    assert wait_gone(pids, 1.0) == []
    assert shm not in segments()


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_driver_sigkilled_devices_exit_by_themselves(start_method):
    proc, pids, shm = _start_driver(start_method, 3)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=5.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert wait_gone(pids, 3.0) == []
    assert not [e for e in segments() if e.startswith(f"virtualpar-{proc.pid}-")]


# -- the error types --------------------------------------------------------------------------------

ALL_ERRORS = [virtualpar.errors.__dict__[name] for name in virtualpar.errors.__all__
              if name not in ("RemoteTraceback",)]


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_every_error_pickles_with_message_and_attributes(cls):
    err = cls("device 3 (dp=1, tp=1): something at op #7", rank=3, op_seq=7, group=(0, 1, 2, 3),
              calls={0: "x"})
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and str(back) == str(err) and isinstance(back, VirtualParError)
    assert (back.rank, back.op_seq, back.group, back.calls) == (3, 7, (0, 1, 2, 3), {0: "x"})
    assert back.details == err.details
    assert hasattr(virtualpar, cls.__name__) or cls is VirtualParError


def test_remote_traceback_pickles():
    tb = RemoteTraceback("Traceback ...\nValueError: x")
    back = pickle.loads(pickle.dumps(tb))
    assert back.tb == tb.tb and "ValueError: x" in str(back)


def test_errors_from_a_real_run_pickle():
    with cluster(4) as c:
        with pytest.raises(CollectiveMismatch) as info:
            c.run(mismatched, "dtype")
        back = pickle.loads(pickle.dumps(info.value))
        assert (
            str(back) == str(info.value)
            and back.differs == ["dtype"]
            and set(back.flight_records) == {0, 1, 2, 3}
        )


def test_configuration_errors_are_value_errors():
    assert issubclass(MeshError, ValueError) and issubclass(ShardingError, ValueError)
    assert issubclass(UsageError, ValueError) and issubclass(PayloadError, TypeError)
    assert issubclass(NonFiniteError, FloatingPointError)
    with pytest.raises(ValueError):
        Mesh({"dp": 2, "dp2": -1})


def _start_a_cluster_inside(dev):
    with VirtualCluster(2) as inner:
        return inner.run(rank_of)


def test_a_cluster_inside_a_device_and_fault_values_are_named_errors():
    """Nesting failed on multiprocessing's bare assertion (and ran under python -O); a delay of -1 s
    or an exit code 'x' was accepted and failed later on the device."""
    with cluster(2) as c:
        with pytest.raises(UsageError, match="a VirtualCluster cannot be started inside a device"):
            c.run(_start_a_cluster_inside)
        with pytest.raises(UsageError, match="seconds must be a finite number >= 0, got -1"):
            c.inject(0, 1, "delay", seconds=-1)
        with pytest.raises(UsageError, match="code must be an exit status 0..255, got 'x'"):
            c.inject(0, 1, "exit", code="x")
        assert c.run(rank_of) == [0, 1]


def _one_odd_shape(dev):
    dev.all_reduce(np.ones(3 if dev.rank == 5 else 4))


def test_a_mismatch_in_a_large_group_lists_each_distinct_call_once():
    """At 64 devices the message listed 64 calls, the odd one out somewhere in the middle."""
    with cluster(12) as c:
        with raises_within(CollectiveMismatch) as info:
            c.run(_one_odd_shape)
    lines = [ln.strip() for ln in str(info.value).splitlines()[1:]]
    assert lines[0].startswith("device 5 (world=5) called all_reduce(shape=(3,)")
    assert lines[1].startswith("11 devices (0-4, 6-11) called all_reduce(shape=(4,)")
    assert len(info.value.calls) == 12  # every call is still in the error's fields
