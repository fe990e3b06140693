"""How ``MPIDevice`` hands arriving messages to its posted receives (virtualpar/mpi/matching.py),
against MPI's matching rule, on a scripted stand-in for the communicator: each message goes to the
earliest posted receive it fits, and one source's messages are taken in the order they arrived.
The races these pin down depend on when messages arrive between two probes, which a real
``mpiexec`` run reproduces only sometimes; the end-to-end behaviour is in test_mpi_backend.py."""

from __future__ import annotations

import pytest

MPI = pytest.importorskip("mpi4py.MPI")

from virtualpar import ANY_SOURCE, ANY_TAG  # noqa: E402
from virtualpar.mpi.device import MPIDevice  # noqa: E402
from virtualpar.mpi.requests import RecvRequest  # noqa: E402


class ScriptedComm:
    """Messages ``(source, tag)`` in arrival order; the later ones become visible only after
    ``hidden_for`` probes, as if they arrived between two probes."""

    def __init__(self, visible: list[tuple[int, int]], later: list[tuple[int, int]], hidden_for: int,
                 sent_once_taken: dict | None = None) -> None:
        self.queue, self.later, self.hidden_for = list(visible), list(later), hidden_for
        self.sent_once_taken = sent_once_taken or {}  # message -> what its sender sends once it is received

    def Iprobe(self, status=None, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG) -> bool:
        found = next(((s, t) for s,
                      t in self.queue if source in (s, MPI.ANY_SOURCE) and tag in (t, MPI.ANY_TAG)), None)
        self.hidden_for -= 1
        if self.hidden_for == 0:  # they arrive right after this probe
            self.queue += self.later
        if found is not None:
            status.Set_source(found[0])
            status.Set_tag(found[1])
        return found is not None


def _device(comm: ScriptedComm) -> tuple[MPIDevice, list]:
    dev = MPIDevice.__new__(MPIDevice)
    dev.comm, dev._posted, dev._stash, taken = comm, [], [], []  # (nothing probed: the stash stays empty)

    def take(req, source, tag):
        comm.queue.remove((source, tag))  # the first from that source with that tag: MPI's order
        comm.queue += comm.sent_once_taken.pop((source, tag), [])
        dev._posted.remove(req)
        req.done, req.value = True, (source, tag)
        taken.append((req, source, tag))

    dev._take = take
    return dev, taken


def _until(dev: MPIDevice, goal: RecvRequest, polls: int = 50) -> bool:
    """Poll as a wait does, at most ``polls`` times (the broken matching never got there)."""
    for _ in range(polls):
        dev._match()
        if goal.done:
            return True
    return False


def _post(dev: MPIDevice, src: int, tag: int) -> RecvRequest:
    req = RecvRequest.__new__(RecvRequest)
    req.src, req.tag, req.done, req.value, req.error = src, tag, False, None, None
    req.which = dict(source=MPI.ANY_SOURCE if src == ANY_SOURCE else src,
                     tag=MPI.ANY_TAG if tag == ANY_TAG else tag)
    dev._posted.append(req)
    return req


def test_an_earlier_receive_gets_the_first_message_of_its_source_it_fits():
    """A wildcard-tag receive from device 1, then a receive of tag 5 from it; device 1 sends tag 7,
    then tag 5, both arriving after the first receive's probe.  The tag-5 receive's probe finds the
    tag-5 message, which the earlier wildcard receive fits too — but that receive is owed the
    tag-7 message, which came first: it took the tag-5 one, and the tag-5 receive waited forever."""
    dev, taken = _device(ScriptedComm([], [(1, 7), (1, 5)], hidden_for=1))
    anything, five = _post(dev, 1, ANY_TAG), _post(dev, 1, 5)
    assert _until(dev, five)
    assert anything.value == (1, 7) and five.value == (1, 5)


def test_messages_go_to_receives_in_posting_order_whichever_is_waited_on():
    """Arrivals (2, 4), (0, 4), (2, 4) against receives posted as (2, 4), (any, 4), (2, 4): MPI
    gives each arrival to the earliest receive it fits — the first, the wildcard, the last."""
    dev, taken = _device(ScriptedComm([(2, 4), (0, 4), (2, 4)], [], hidden_for=0))
    first, any_source, second = _post(dev, 2, 4), _post(dev, ANY_SOURCE, 4), _post(dev, 2, 4)
    assert _until(dev, second)
    assert [r for r, _, _ in taken] == [first, any_source, second]
    assert first.value == (2, 4) and any_source.value == (0, 4) and second.value == (2, 4)


def test_a_message_no_earlier_receive_fits_does_not_hold_up_a_later_one():
    """Device 2's tag-9 message waits for a receive not posted yet; its tag-4 message behind it
    goes to the receive of tag 4 (MPI keeps order only among messages one receive could match)."""
    dev, taken = _device(ScriptedComm([(2, 9), (2, 4)], [], hidden_for=0))
    four = _post(dev, 2, 4)
    assert _until(dev, four) and four.value == (2, 4) and dev.comm.queue == [(2, 9)]


def test_a_wait_takes_messages_for_receives_posted_after_the_one_it_waits_for():
    """Receives of tags 2 then 1 from device 1, which sends tag 1 (large: MPI's send waits for the
    receive) before tag 2: waiting on the first must take the tag-1 message for the second, or
    the sender never gets to tag 2 (under mpiexec that was a P2PTimeout)."""
    dev, taken = _device(ScriptedComm([(1, 1)], [], hidden_for=0, sent_once_taken={(1, 1): [(1, 2)]}))
    two, one = _post(dev, 1, 2), _post(dev, 1, 1)
    assert _until(dev, two)
    assert [r for r, _, _ in taken] == [one, two]
