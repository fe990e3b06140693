"""``cluster.put(..., block=False)``: the command is posted and its reply read with the next one
from that device (``ClusterControl.post``/``settle``).  Values arrive in order; a posted put that
fails fails the next call with its own error and leaves a usable cluster; a device that dies
after a posted put is a ``DeviceDied`` at the next call; a value too large for the host's ring at
once is put blocking instead."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from virtualpar import VirtualCluster
from virtualpar.errors import DeviceDied, PayloadError, UsageError

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(60)]


def _read(dev, key):
    return dev.state.get(key)


def _explode():
    raise RuntimeError("this value cannot be rebuilt on a device")


class _Unloadable:
    """Pickles in the driver; unpickling it on a device raises."""

    def __reduce__(self):
        return (_explode, ())


def _slowly():
    import time

    time.sleep(0.5)
    return "slow"


class _SlowToLoad:
    """Unpickling it on a device takes half a second: the device is busy, later commands wait in its ring."""

    def __reduce__(self):
        return (_slowly, ())


def test_a_posted_put_behind_a_busy_device_survives_another_devices_failure():
    """Device 0 was still loading a first posted put when device 1's get failed; the reset zeroed
    the rings with the second put unread, and device 0 waited out its 5 s timeout for it (CI hit
    this under load with one put, device 0 merely not scheduled yet)."""
    with VirtualCluster(2, timeout=5) as c:
        c.put(0, "slow", _SlowToLoad(), block=False)
        c.put(0, "cfg", {"a": 1}, block=False)
        with pytest.raises(UsageError, match="has no state"):
            c.get(1, "missing")
        assert c.run(_read, "cfg") == [{"a": 1}, None]
        assert c.run(_read, "slow") == ["slow", None]


def test_posted_puts_arrive_in_order_before_the_next_run():
    with VirtualCluster(2, timeout=5) as c:
        for i in range(5):  # several posted to one device: the last one wins
            c.put(1, "k", np.full(3, float(i)), block=False)
        c.put(0, "k", {"a": 1}, block=False)
        got = c.run(_read, "k")
        assert got[0] == {"a": 1}
        np.testing.assert_array_equal(got[1], np.full(3, 4.0))
        assert not c._ctl.posted  # every posted reply was read
        c.put(0, "k", 7, block=False)
        assert c.get(0, "k") == 7  # a get reads the posted reply first


def test_a_failed_posted_put_fails_the_next_call_with_its_own_error_and_the_cluster_goes_on():
    with VirtualCluster(2, timeout=5) as c:
        c.put(1, "bad", _Unloadable(), block=False)  # the driver's half succeeds: nothing raised yet
        with pytest.raises(PayloadError,
                           match="the posted put 'bad' failed: device 1.*cannot be rebuilt") as info:
            c.run(_read, "bad")
        assert info.value.rank == 1
        assert c.run(_read, "bad") == [None, None]  # reset: the next run starts clean
        c.put(0, "bad", _Unloadable(), block=False)
        with pytest.raises(PayloadError, match="the posted put 'bad' failed: device 0.*cannot be rebuilt"):
            c.get(0, "bad")
        c.put(0, "ok", 1.5, block=False)
        assert c.get(0, "ok") == 1.5


def test_a_failed_posted_put_is_still_raised_when_another_device_fails_first(caplog):
    """A get from device 1 failed first; the reset after it read device 0's posted reply and dropped
    its error, so the put was lost without a word (the next run found no 'cfg' anywhere)."""
    with VirtualCluster(2, timeout=5) as c:
        c.put(0, "cfg", _Unloadable(), block=False)
        with pytest.raises(UsageError, match="has no state\\['missing'\\]"):
            c.get(1, "missing")
        with pytest.raises(PayloadError, match="the posted put 'cfg' failed: device 0.*cannot be rebuilt"):
            c.run(_read, "cfg")
        assert c.run(_read, "cfg") == [None, None]
        c.put(1, "cfg", _Unloadable(), block=False)
        with pytest.raises(UsageError):
            c.get(0, "missing")
    # ... and one that nothing reads afterwards is logged at close
    assert "the posted put 'cfg' failed: device 1" in caplog.text


def test_a_device_that_dies_after_a_posted_put_is_named_at_the_next_call():
    with VirtualCluster(2, timeout=5) as c:
        c.put(1, "k", np.ones(4), block=False)
        os.kill(c.pids[1], signal.SIGKILL)
        with pytest.raises(DeviceDied, match="device 1"):
            c.run(_read, "k")
        assert c.closed


def test_a_value_too_large_for_the_host_ring_is_put_blocking():
    with VirtualCluster(2, timeout=5, ring_bytes=64 << 10) as c:
        big = np.arange(64 << 10, dtype=np.float64)  # 512 KiB through a 64 KiB ring
        c.put(0, "big", big, block=False)
        assert not c._ctl.posted  # it waited for the device, as a blocking put does
        np.testing.assert_array_equal(c.run(_read, "big")[0], big)


def test_a_failed_posted_put_that_nothing_reads_is_logged_at_close(caplog):
    c = VirtualCluster(2, timeout=5)
    c.put(1, "bad", _Unloadable(), block=False)
    with caplog.at_level("WARNING", logger="virtualpar.runtime.control"):
        c.close()
    assert "the posted put 'bad' failed" in caplog.text and "cannot be rebuilt" in caplog.text
    assert c.closed


def test_every_device_s_failed_posted_put_is_raised_not_only_the_first():
    """Two devices' posted puts failed: the next run raised device 0's and dropped device 1's."""
    with VirtualCluster(2, timeout=5) as c:
        c.put(0, "bad", _Unloadable(), block=False)
        c.put(1, "bad", _Unloadable(), block=False)
        with pytest.raises(PayloadError, match="the posted put 'bad' failed: device 0"):
            c.run(_read, "bad")
        with pytest.raises(PayloadError, match="the posted put 'bad' failed: device 1"):
            c.run(_read, "bad")
        assert c.run(_read, "bad") == [None, None]
