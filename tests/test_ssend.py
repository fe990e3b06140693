"""Synchronous sends (MPI's ``Ssend``/``Issend``): complete only once a matching receive has taken
the message, whatever its size and whatever ``eager_limit`` — so a program that completes with
them does not rely on buffering."""

from __future__ import annotations

import time

import numpy as np
import pytest

from virtualpar import VirtualCluster
from virtualpar.errors import Deadlock, UsageError

TIMEOUT = 30.0


def _ring(dev, sync: bool):
    """Everybody sends right, then receives from the left: only buffering lets it through."""
    right, left = (dev.rank + 1) % dev.size, (dev.rank - 1) % dev.size
    (dev.ssend if sync else dev.send)(np.full(2, float(dev.rank)), right)
    return float(dev.recv(left)[0])


def test_an_ssend_ring_is_the_deadlock_a_send_ring_hides(no_leaks):
    with VirtualCluster(3, timeout=TIMEOUT) as c:
        assert c.run(_ring, False) == [2.0, 0.0, 1.0]
        with pytest.raises(Deadlock, match=r"device 0 waits send to 1 \(tag 0\) ← device 1 waits send to 2"):
            c.run(_ring, True)
        assert c.run(_ring, False) == [2.0, 0.0, 1.0]  # the cluster stays usable


def _pending_until_received(dev, payload):
    if dev.rank == 0:
        req = dev.issend(payload, 1, tag=5)
        dev.barrier()
        before = req.test()
        dev.barrier()
        req.wait()
        return before
    dev.barrier()
    dev.barrier()
    got = dev.recv(0, tag=5)
    return got.shape if isinstance(got, np.ndarray) else got


@pytest.mark.parametrize("payload", [np.ones(1), np.empty((0, 3)), np.ones(1 << 17), {"a": 1}],
                         ids=["8 bytes", "empty", "1 MiB", "object"])
def test_an_issend_completes_only_once_its_receive_took_it(payload):
    with VirtualCluster(2, timeout=TIMEOUT) as c:
        before, got = c.run(_pending_until_received, payload)
    assert before is False
    assert got == (payload.shape if isinstance(payload, np.ndarray) else payload)


def _many(dev, count: int, order: str):
    if dev.rank == 0:
        reqs = [dev.issend(np.full(3, float(i)), 1, tag=i) for i in range(count)]
        for r in reqs:
            r.wait()
        return None
    tags = range(count) if order == "forward" else reversed(range(count))
    return [float(dev.recv(0, tag=t)[0]) for t in tags]


@pytest.mark.parametrize("count, order", [(3, "reverse"), (12, "reverse"), (12, "forward")])
def test_issends_to_one_peer_complete_as_their_receives_come(count, order):
    """Up to 7 wait as offers in the channel's slots; the rest travel eagerly and are done when
    their receiver says a receive took them — in any order, as MPI's (8 or more received in
    reverse were a false Deadlock while the 8th waited for a slot)."""
    with VirtualCluster(2, timeout=TIMEOUT) as c:
        got = c.run(_many, count, order)[1]
    assert got == [float(t) for t in (range(count) if order == "forward" else reversed(range(count)))]


def _overtaken(dev):
    """Eight issends, then a plain send with another tag, which the receiver takes first."""
    if dev.rank == 0:
        reqs = [dev.issend(np.full(2, float(i)), 1, tag=i) for i in range(8)]
        dev.send("hello", 1, tag=99)
        for r in reqs:
            r.wait()
        return None
    return [dev.recv(0, tag=99)] + [float(dev.recv(0, tag=t)[0]) for t in reversed(range(8))]


def test_a_send_after_many_issends_is_not_held_behind_them():
    with VirtualCluster(2, timeout=TIMEOUT) as c:
        assert c.run(_overtaken)[1] == ["hello"] + [float(t) for t in reversed(range(8))]


def _to_itself(dev, posted: bool):
    req = dev.irecv(dev.rank, tag=2) if posted else None
    dev.ssend(np.arange(2.0), dev.rank, tag=2)
    return req.wait().tolist()


def test_an_ssend_to_itself_needs_its_receive_posted_first():
    """MPI completes it then, and hangs otherwise: here the hang is an error at once."""
    with VirtualCluster(2, timeout=TIMEOUT) as c:
        assert c.run(_to_itself, True) == [[0.0, 1.0]] * 2
        with pytest.raises(UsageError,
                           match=r"ssend to itself \(tag 2\) of 16 bytes at op #\d+ is synchronous: it "
                                             "waits for its receive, none is posted"):
            c.run(_to_itself, False)
        assert c.run(_to_itself, True) == [[0.0, 1.0]] * 2  # nothing was left queued


def _issend_to_itself(dev, wait_first: bool):
    req = dev.issend(np.ones(2), np.int64(dev.rank), tag=np.int64(3))  # numpy ints: the same call
    if wait_first:
        req.wait()
    before = req.test()
    got = dev.recv(dev.rank, tag=3).tolist()
    req.wait()
    return before, req.test(), got


def test_an_issend_to_itself_is_done_once_its_own_receive_took_it():
    """MPI's Issend to oneself completes when the receive comes; waiting first hangs under MPI,
    and is an error here (it was complete at once, and an ssend with numpy ints skipped the check)."""
    with VirtualCluster(2, timeout=TIMEOUT) as c:
        assert c.run(_issend_to_itself, False) == [(False, True, [1.0, 1.0])] * 2
        with pytest.raises(UsageError,
                           match=r"issend to itself \(tag 3\): no receive of this device has taken it"):
            c.run(_issend_to_itself, True)
        with pytest.raises(UsageError, match=r"ssend to itself \(tag 3\) of 16 bytes .* is synchronous"):
            c.run(lambda dev: dev.ssend(np.ones(2), np.int64(dev.rank), tag=np.int64(3)))


def _strict_and_sync(dev):
    """In strict mode, an ssend below the limit still waits: the two are independent."""
    if dev.rank == 0:
        req = dev.issend(np.ones(1), 1)
        dev.barrier()
        before = req.test()
        dev.barrier()
        return before, req.wait()
    dev.barrier()
    dev.barrier()  # (the receive comes only after device 0 has looked)
    return None, dev.recv(0).tolist()


def test_an_issend_below_the_eager_limit_still_waits_for_its_receive():
    with VirtualCluster(2, eager_limit=1 << 20, timeout=TIMEOUT) as c:
        assert c.run(_strict_and_sync) == [(False, None), (None, [1.0])]


PAY = 1024 - 72  # a 72-byte header and 952 bytes: four such frames fill a 4096-byte ring


def _ack_behind_own_sends(dev):
    """Device 1 takes device 0's eager issend (its 8th: the 7 offer slots are held) while its own
    ring to device 0 is full of isends device 0 takes only later, so its acknowledgement waits in
    its queue; device 1's run ends before device 0 frees the room (the sleeps order it)."""
    if dev.rank == 0:
        held = [dev.issend(np.zeros(1), 1, tag=t) for t in range(1, 8)]
        last = dev.issend(np.zeros(1), 1, tag=0)
        time.sleep(0.3)
        got = [dev.recv(1, tag=100).size for _ in range(8)]
        for r in held + [last]:
            r.wait()
        return got
    out = [dev.isend(np.zeros(PAY, np.uint8), 0, tag=100) for _ in range(8)]
    dev.recv(0, tag=0)
    for r in out:
        r.wait()
    return [dev.recv(0, tag=t).size for t in range(1, 8)]


def test_an_acknowledgement_queued_behind_the_receivers_own_sends_is_written_before_its_run_ends():
    """It waited in the queue with nobody left to write it: a correct program ended in a Deadlock
    naming device 0's send and "device 1 has returned from the run"."""
    with VirtualCluster(2, timeout=TIMEOUT, ring_bytes=4096) as c:
        assert c.run(_ack_behind_own_sends) == [[PAY] * 8, [1] * 7]


def _never_received(dev, nbytes):
    if dev.rank == 0:
        return [dev.issend(np.zeros(nbytes, np.uint8), 1, tag=t).test() for t in range(8)]
    return None


@pytest.mark.parametrize("nbytes", [100, 20000], ids=["whole in the ring", "larger than the ring"])
def test_issends_never_received_are_reported_once_each(nbytes):
    """The 8th (eager) one, still being streamed, was listed twice: as acknowledged-to-be and as queued."""
    from virtualpar.errors import UnmatchedMessages

    with VirtualCluster(2, timeout=TIMEOUT, ring_bytes=4096) as c:
        with pytest.raises(UnmatchedMessages) as info:
            c.run(_never_received, nbytes)
    text = str(info.value)
    assert "8 messages were sent and never received" in text
    assert sum(f"tag {t}:" in text for t in range(8)) == 8 and text.count("tag 7:") == 1


def _strict_isend_to_itself(dev):
    req = dev.isend(np.ones(4), dev.rank, tag=1)
    before = req.test()
    dev.recv(dev.rank, tag=1)
    return before, req.test()


def test_in_strict_mode_an_isend_to_itself_waits_for_its_receive_too():
    with VirtualCluster(2, eager_limit=0, timeout=TIMEOUT) as c:
        assert c.run(_strict_isend_to_itself) == [(False, True)] * 2


def _receive_gives_up(dev, hold_slots: bool):
    """Device 1's receive of device 0's 20000-byte issend (through a 4096-byte ring: it arrives
    in pieces, only while device 0 makes progress) times out while the message is still coming
    and is withdrawn; device 0 looks whether its issend is done before device 1 receives it again."""
    from virtualpar.errors import P2PTimeout

    if dev.rank == 0:
        # then it goes eager
        held = [dev.issend(np.zeros(1), 1, tag=t) for t in range(1, 8)] if hold_slots else []
        req = dev.issend(np.zeros(20000, np.uint8), 1, tag=0)
        # (device 1's receive, which gives up after 0.2 s of no progress, times out meanwhile)
        time.sleep(1.0)
        dev.barrier()
        deadline = time.monotonic() + 0.5
        while not req.test() and time.monotonic() < deadline:
            pass
        early = req.test()
        dev.barrier()
        for r in held + [req]:
            r.wait()
        return early
    try:
        dev.recv(0, tag=0, timeout=0.2)
        gave_up = False
    except P2PTimeout:
        gave_up = True
    dev.barrier()
    dev.barrier()
    sizes = [dev.recv(0, tag=t).size for t in range(8 if hold_slots else 1)]
    return gave_up, sizes[0]


@pytest.mark.parametrize("path, hold_slots, read", [("eager", True, None), ("refused offer", False, 14)])
def test_an_issend_whose_receive_gave_up_is_done_only_when_a_later_one_took_it(
    monkeypatch, path, hold_slots, read
):
    """Its receiver used to tell the sender "taken" on matching the header, so the send completed
    although the receive that matched it then timed out and no receive had taken it."""
    import virtualpar.transport.rendezvous as rendezvous

    if read is not None:
        monkeypatch.setattr(rendezvous, "read_remote", lambda *args: read)  # EFAULT: the offer is streamed
    with VirtualCluster(2, timeout=TIMEOUT, ring_bytes=4096) as c:
        assert c.run(_receive_gives_up, hold_slots) == [False, (True, 20000)]
