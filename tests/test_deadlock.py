"""Deadlock detection (runtime/deadlock.py): the classic cases are named within a fraction of the
op timeout (30 s here), and programs that are merely slow are never called deadlocked."""

from __future__ import annotations

import time

import pytest

from virtualpar import VirtualCluster
from virtualpar.errors import Deadlock
from virtualpar.transport import waitboard as board

from . import _deadlock_fns as fns

TIMEOUT = 30.0
WELL_BELOW = 5.0  # detection must beat the op timeout by far; not a tight bound on a loaded machine


def _deadlock(cluster: VirtualCluster, fn, *args) -> tuple[Deadlock, float]:
    t0 = time.monotonic()
    with pytest.raises(Deadlock) as info:
        cluster.run(fn, *args)
    return info.value, time.monotonic() - t0


def test_two_devices_receiving_first(no_leaks):
    with VirtualCluster(2, timeout=TIMEOUT) as c:
        err, took = _deadlock(c, fns.recv_first)
        assert took < WELL_BELOW
        assert "device 0 waits recv from 1 (tag 0) ← device 1 waits recv from 0 (tag 0)" in str(err)
        assert "op #1 recv from 1 tag=0" in str(err) and "op #1 recv from 0 tag=0" in str(err)
        assert err.cycle == [0, 1]
        assert c.run(fns.slow_sender, 0.0) == [0.0, 3.0]  # the cluster stays usable


def test_collective_waiting_for_a_device_blocked_in_a_receive():
    with VirtualCluster({"x": 3}, timeout=TIMEOUT) as c:
        err, took = _deadlock(c, fns.collective_vs_recv)
        assert took < WELL_BELOW
        text = str(err)
        assert "device 2 waits recv from 0 (tag 5)" in text
        assert "all_reduce" in text  # devices 0 and 1 are named in their collective op
        assert set(err.waits) == {0, 1, 2}


def test_pipeline_criss_cross():
    with VirtualCluster(3, timeout=TIMEOUT) as c:
        err, took = _deadlock(c, fns.criss_cross)
        assert took < WELL_BELOW
        assert "device 1 waits recv from 2 (tag 1) ← device 2 waits recv from 1 (tag 0)" in str(err)
        assert err.cycle == [1, 2]


@pytest.mark.parametrize("any_source, waits",
                         [(False,
                           "device 0 waits recv from 1 (tag any) ← device 1 waits recv from 0 (tag any)"),
                                                (True,
                                                 "device 0 waits recv from any source (tag any) ← device 1 "
                                                 "waits recv from any source (tag any)")])
def test_receives_with_any_tag_are_named_not_timed_out(any_source, waits):
    """A receive with any tag published no wait ('OTHER'), so this classic waited the whole op
    timeout — and it is what an mpi4py program's comm.recv(source=p) does."""
    with VirtualCluster(2, timeout=TIMEOUT) as c:
        err, took = _deadlock(c, fns.recv_any_tag_first, any_source)
        assert took < WELL_BELOW
        assert waits in str(err)
        assert c.run(fns.slow_sender_any_tag, 0.5) == [0.0, 3.0]  # a late sender of any tag is not one


def test_two_devices_in_wait_any_first_are_a_named_deadlock_and_a_slow_sender_is_not():
    """wait_any published no wait board entry ('OTHER'), so this waited the whole op timeout."""
    with VirtualCluster(2, timeout=TIMEOUT) as c:
        err, took = _deadlock(c, fns.wait_any_first)
        assert took < WELL_BELOW
        assert (
            "device 0 waits any of several requests (wait_any) ← device 1 waits any of several requests"
            in str(err)
        )
        # whichever arrived first, then the other
        assert c.run(fns.wait_any_slow_sender, 0.5)[1] in (43.0, 34.0)


def test_two_devices_probing_first_are_a_named_deadlock():
    with VirtualCluster(2, timeout=TIMEOUT) as c:
        err, took = _deadlock(c, fns.probe_first)
        assert took < WELL_BELOW
        assert "device 0 waits recv from 1 (tag any) ← device 1 waits recv from 0 (tag any)" in str(err)


def test_waiting_for_a_device_that_returned():
    with VirtualCluster(2, timeout=TIMEOUT) as c:
        err, took = _deadlock(c, fns.wait_for_returned)
        assert took < WELL_BELOW
        assert "device 0 waits recv from 1 (tag 9) ← device 1 has returned from the run" in str(err)


def test_a_slow_sender_is_not_a_deadlock():
    """Device 1 sleeps in its receive for 0.5 s while device 0 computes: live, never reported."""
    with VirtualCluster(2, timeout=TIMEOUT) as c:
        assert c.run(fns.slow_sender, 0.5) == [0.0, 3.0]


def test_buffered_ring_is_not_a_deadlock():
    """A ring of blocking sends completes while the channels buffer (the default)."""
    with VirtualCluster(4, timeout=TIMEOUT) as c:
        assert c.run(fns.ring_exchange, 1 << 12) == [3.0, 0.0, 1.0, 2.0]


def test_detection_can_be_turned_off():
    with VirtualCluster(2, timeout=0.5, detect_deadlocks=False) as c:
        with pytest.raises(Exception) as info:
            c.run(fns.recv_first)
        assert not isinstance(info.value, Deadlock)


def test_a_device_skipping_a_collective_is_a_deadlock_not_a_timeout():
    from .test_faults import rank_of
    from .test_faults import skip_second

    with VirtualCluster(4, timeout=TIMEOUT) as c:
        err, took = _deadlock(c, skip_second)
        assert took < WELL_BELOW
        assert "← device 3 has returned from the run" in str(err)
        assert c.run(rank_of) == [0, 1, 2, 3]


def test_a_device_skipping_the_shm_all_reduce_leaves_its_peers_in_a_fence():
    """The shm all_reduce waits on arrival counters, not messages: the fence is on the board too."""
    from .test_shm_all_reduce import _shm_twice

    with VirtualCluster(3, check_collectives=False, timeout=TIMEOUT, trace=False) as c:
        err, took = _deadlock(c, _shm_twice, 1)
        assert took < WELL_BELOW
        assert "device 0 waits fence with [1] ← device 1 has returned from the run" in str(err)
        assert "device 2 (world=2) in op #2 all_reduce" in str(err)
        assert [len(r) for r in c.run(_shm_twice)] == [2, 2, 2]


def test_strict_mode_turns_an_unsafe_ring_into_a_named_deadlock(no_leaks):
    with VirtualCluster(3, timeout=TIMEOUT, eager_limit=0) as c:
        err, took = _deadlock(c, fns.ring_exchange, 64)
        assert took < WELL_BELOW
        assert ("device 0 waits send to 1 (tag 3) ← device 1 waits send to 2 (tag 3) ← device "
                "2 waits send to 0 (tag 3)"
                in str(err))
        assert "op #1 send to 1 tag=3 array(shape=(8,), float64)" in str(err)


def test_a_byte_limit_keeps_small_messages_eager():
    with VirtualCluster(3, timeout=TIMEOUT, eager_limit=1024) as c:
        assert c.run(fns.ring_exchange, 512) == [2.0, 0.0, 1.0]  # 512 B: buffered, the ring completes
        err, _ = _deadlock(c, fns.ring_exchange, 4096)  # 4 KiB > the limit: a rendezvous each
        assert err.cycle == [0, 1, 2]


def test_strict_mode_runs_safe_programs():
    """Receives posted before the matching sends: strict mode changes nothing."""
    with VirtualCluster(2, timeout=TIMEOUT, eager_limit=0) as c:
        assert c.run(fns.slow_sender, 0.2) == [0.0, 3.0]
        assert c.run(fns.safe_ring, 1 << 20) == [1.0, 0.0]


def test_eager_limit_is_checked():
    from virtualpar.errors import UsageError

    with pytest.raises(UsageError, match="eager_limit must be an int >= 0"):
        VirtualCluster(2, eager_limit=-1)


@pytest.mark.parametrize("algorithm", ["ring", "tree", "direct", "shm"])
def test_the_collectives_are_safe_in_strict_mode(algorithm):
    """Our own collectives never rely on buffering: they complete with every send a rendezvous."""
    import numpy as np

    n = 3
    xs = [np.arange(12.0) + 100 * r for r in range(n)]
    with VirtualCluster(n, timeout=TIMEOUT, eager_limit=0) as c:
        for got in c.run(fns.collectives, algorithm):
            np.testing.assert_array_equal(got[0], sum(xs))
            np.testing.assert_array_equal(got[1], np.concatenate(xs))
            np.testing.assert_array_equal(got[2], xs[1])


@pytest.mark.parametrize("shuffle", [None, 3])
def test_eight_devices_on_two_cores_never_look_deadlocked(shuffle):
    """8 devices (more than this machine's cores), waits that sleep all the time: no false Deadlock."""
    rounds = 25
    with VirtualCluster({"a": 2, "b": 4}, timeout=TIMEOUT, shuffle=shuffle) as c:
        got = c.run(fns.busy_mix, rounds)
    for r in range(8):
        ring = sum(float((r - 1) % 8 + k) for k in range(rounds))
        assert got[r] == ring + rounds * (2.0 + 8.0)


def _staggered(dev):
    time.sleep(0.01 * dev.rank)  # replies reach the driver one by one
    return dev.rank


def test_the_driver_scans_on_its_own_clock_not_at_every_reply(monkeypatch):
    import virtualpar.runtime.deadlock as deadlock

    with VirtualCluster(4, timeout=10) as c:
        watch = c._ctl.sup.watch
        scans = []
        real = watch.scan
        monkeypatch.setattr(watch, "scan", lambda running: scans.append(len(running)) or real(running))
        monkeypatch.setattr(deadlock, "WATCH_EVERY", 30.0)  # the first scan would come after 30 s
        assert c.run(_staggered) == [0, 1, 2, 3]
        assert scans == []  # four replies, no scan (each wake-up scanned before)


def test_the_scan_interval_grows_with_the_scan_cost_and_shrinks_to_confirm(monkeypatch):
    import virtualpar.runtime.deadlock as deadlock

    with VirtualCluster(2, timeout=10) as c:
        watch = c._ctl.sup.watch
        watch.reset()
        assert watch.every == deadlock.WATCH_EVERY
        monkeypatch.setattr(watch, "_scan", lambda running: time.sleep(0.01))
        watch.scan({0, 1})
        assert watch.every >= 0.01 / deadlock.SCAN_SHARE  # scans take at most SCAN_SHARE of the driver's time
        watch._candidate = ("a dead set", 1, {})  # waiting to confirm one: look again soon
        watch.scan({0, 1})
        assert watch.every == deadlock.WATCH_EVERY
        watch._candidate = None


class _TornBoard:
    """A wait board read across a wake-up: ``GEN`` was 5 (asleep in a send to device 1) when the
    scan began, and the words it then read mix a fence wait's kind with the send's peer under the
    next sleep's ``GEN``."""

    def __init__(self, words):
        self.words = list(words)

    def __getitem__(self, key):
        if isinstance(key, slice):
            return self.words[key]
        return 5 if key == board.GEN else self.words[key]


def test_a_board_read_across_a_wake_up_counts_as_awake_not_as_a_wait():
    """A fence entry naming kind 3 (a peer rank, read from the entry after) crashed the driver's
    scan with an IndexError, in a sweep that alternated ring and shm reduce_scatters on 4 devices
    (a 1-D mesh has two fence kinds).  Now the scan sees that GEN moved while it read."""
    with VirtualCluster(2, timeout=10) as c:
        watch = c._ctl.sup.watch
        boards = watch._boards
        torn = [board.FENCE, 3, 1, 3, 7, 0, 0]  # KIND PEER TAG MASK GEN POKE ACK
        watch._boards = [_TornBoard(torn), _TornBoard([board.RECV, 0, 0, 0, 5, 0, 0])]
        try:
            snap = watch._read()
            assert snap[0][board.KIND] == board.NONE and snap[1][board.KIND] == board.RECV
            assert watch.dead_set({0, 1}, snap) == set()  # device 1 waits on device 0, which is awake
        finally:
            watch._boards = boards
        assert c.run(lambda dev: dev.rank) == [0, 1]
