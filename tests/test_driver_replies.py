"""What the driver does with replies it cannot take as they are: a class only the devices can
import, a class a run brought by value, and a round interrupted in the driver."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from virtualpar import VirtualCluster
from virtualpar.errors import ClusterClosedError, PayloadError


def _device_only_class(dev, path):
    if dev.rank == 0:
        import sys

        sys.path.insert(0, path)
        import vp_device_only_module

        return vp_device_only_module.Thing()
    time.sleep(0.2)  # replies after rank 0's: before the fix, it was read one round late
    return ("first", dev.rank)


def test_a_reply_the_driver_cannot_load_is_that_devices_error_and_the_pipes_stay_in_step(tmp_path):
    (tmp_path / "vp_device_only_module.py").write_text("class Thing:\n    pass\n")
    with VirtualCluster(2) as cluster:
        with pytest.raises(PayloadError,
                           match=r"device 0 \(world=0\): its reply to .* cannot be unpickled in the "
                                               r"driver \(ModuleNotFoundError"):
            cluster.run(_device_only_class, str(tmp_path))
        for i in range(2):  # every later run answers for itself, not for the one before
            assert cluster.run(lambda dev, i=i: (i, dev.rank)) == [(i, 0), (i, 1)]


def test_a_round_interrupted_in_the_driver_closes_the_cluster():
    """A signal handler's exception (pytest-timeout, an alarm) left the replies a round behind:
    the next run returned the previous run's results."""
    def alarm(*_):
        raise TimeoutError("alarm")

    old = signal.signal(signal.SIGALRM, alarm)
    try:
        with VirtualCluster(2) as cluster:
            signal.setitimer(signal.ITIMER_REAL, 0.1)
            with pytest.raises(TimeoutError, match="alarm"):
                cluster.run(lambda dev: time.sleep(0.5))
            with pytest.raises(ClusterClosedError, match=r"interrupted in the driver by TimeoutError: alarm"):
                cluster.run(lambda dev: dev.rank)
            name = cluster._arena.name
            held = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                    if os.path.exists(f"/proc/self/fd/{fd}")]
            # the interrupted frames' views kept it mapped (plugin: leaked fd)
            assert not [h for h in held if name in h]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_a_class_brought_by_value_comes_back_and_travels_between_devices(tmp_path):
    """A class cloudpickle ships by value (a script's __main__, a notebook: here a module registered
    for it) is rebuilt on the devices; plain pickle then found 'not the same object' and refused to
    send it back or across.  What plain pickle refuses otherwise (a lambda) is still refused."""
    import importlib
    import sys

    import cloudpickle

    (tmp_path / "vp_by_value_module.py").write_text("from collections import namedtuple\nPt = "
                                                    "namedtuple('Pt', 'x y')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        mod = importlib.import_module("vp_by_value_module")
        cloudpickle.register_pickle_by_value(mod)
        Pt = mod.Pt

        def exchange(dev):
            other = 1 - dev.rank
            req = dev.isend(Pt(dev.rank, 2), other)
            got = dev.recv(other)
            req.wait()
            return got

        with VirtualCluster(2) as cluster:
            back = cluster.run(lambda dev: Pt(dev.rank, 1))
            across = cluster.run(exchange)
            with pytest.raises(PayloadError, match="cannot be pickled"):
                cluster.run(lambda dev: lambda: 5)
    finally:
        cloudpickle.unregister_pickle_by_value(mod)
        sys.path.remove(str(tmp_path))
        sys.modules.pop("vp_by_value_module", None)
    assert back == [(0, 1), (1, 1)] and all(isinstance(p, Pt) for p in back)  # the driver's own class
    assert across == [(1, 2), (0, 2)] and all(isinstance(p, Pt) for p in across)


def _rank_one_fails(dev):
    if dev.rank == 1:
        raise ValueError("no")
    return dev.rank * 7


def test_a_failed_run_carries_what_the_other_devices_returned():
    with VirtualCluster(3) as cluster:
        with pytest.raises(Exception, match="raised ValueError") as info:
            cluster.run(_rank_one_fails)
    assert info.value.returned == {0: 0, 2: 14}


class _Interrupted(Exception):
    """What a time-limit handler raises in the driver (a notebook's, pytest-timeout's)."""


class _FlakyPipe:
    """A device's command pipe whose next read is interrupted, as a signal handler would."""

    def __init__(self, conn):
        self._conn, self.armed = conn, True

    def recv_bytes(self, *a):
        if self.armed:
            self.armed = False
            raise _Interrupted("the cell ran out of time")
        return self._conn.recv_bytes(*a)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def test_an_exception_while_a_reply_is_read_is_the_users_and_closes_the_cluster():
    """It was taken for an unloadable reply ('cannot be unpickled (TimeLimit: ...)'), the user's
    `except` never ran, and a half-read pipe left the next command waiting out its timeout."""
    with VirtualCluster(2) as cluster:
        sup = cluster._ctl.sup
        sup.cmd[0] = _FlakyPipe(sup.cmd[0])
        with pytest.raises(_Interrupted):
            cluster.run(lambda dev: dev.rank)
        with pytest.raises(ClusterClosedError, match="interrupted in the driver by _Interrupted"):
            cluster.run(lambda dev: dev.rank)


def test_an_interrupted_posted_put_closes_the_cluster(monkeypatch):
    """A put posted while an operation hands out its inputs: an interrupt between sending the
    command and recording it left every later reply one call behind."""
    with VirtualCluster(2) as cluster:
        ctl = cluster._ctl
        real = ctl.send

        def interrupted(rank, msg, what=""):
            real(rank, msg, what)
            raise KeyboardInterrupt

        monkeypatch.setattr(ctl, "send", interrupted)
        with pytest.raises(KeyboardInterrupt):
            cluster.put(0, "x", np.ones(2), block=False)
        monkeypatch.undo()
        with pytest.raises(ClusterClosedError,
                           match="put 'x' was interrupted in the driver by KeyboardInterrupt"):
            cluster.run(lambda dev: dev.rank)


class _Boom(Exception):
    """An outside exception, as a signal handler raises it."""


def _raise_at_line(k: int, files: tuple[str, ...]):
    """A tracer raising _Boom at the k-th line the driver executes in ``files``."""
    seen = [0]

    def local(frame, event, arg):
        if event == "line":
            seen[0] += 1
            if seen[0] == k:
                raise _Boom(f"line {k}")
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename.endswith(files) else None

    return tracer, seen


@pytest.mark.parametrize("warm_up", [True, False])
def test_an_outside_exception_at_any_line_of_a_round_never_leaves_the_replies_behind(warm_up):
    """Sending and reading a round (and the warm-up's replies, read by the first call) is one
    guarded stretch: an exception raised at *any* line of it either closes the cluster or leaves
    it in step.  With a gap between the sends and the reads, the next run returned the previous
    round's replies (the warm-up's, or an interrupted run's)."""
    import sys

    from virtualpar.errors import VirtualParError

    files = ("runtime/control.py", "runtime/supervisor.py")

    def round_with(tracer):
        cluster = VirtualCluster(2, timeout=10, warm_up=warm_up)
        try:
            sys.settrace(tracer)
            try:
                cluster.run(lambda dev: "interrupted")
            except (_Boom, VirtualParError):
                pass
            finally:
                sys.settrace(None)
            if not cluster.closed:
                assert cluster.run(lambda dev: ("mine", dev.rank)) == [("mine", 0), ("mine", 1)]
        finally:
            cluster.close()

    tracer, seen = _raise_at_line(0, files)  # (never raises) count the lines of a whole round
    round_with(tracer)
    assert seen[0] > 20
    # the sends and reads, then the collect loop
    for k in list(range(1, 60)) + list(range(60, seen[0] + 1, 5)):
        round_with(_raise_at_line(k, files)[0])
