"""How ``MPIDevice`` hands messages to its posted receives: MPI's matching rule, applied lazily.

Under MPI a posted ``Irecv`` takes a message as it arrives; ``MPIDevice`` posts no MPI receive
(its arrays travel as a pickled header, then the array, whose size the header gives), so it keeps
its posted receives (``irecv``, and a blocking ``recv`` while it waits) in posting order and,
whenever it waits on or tests anything, probes for all of them in posting order: a message found
goes to the earliest posted receive it fits — unless that receive's own probe finds another
message first (an earlier one of the same source, with another tag, arrived between two probes),
which it takes instead.  One source's messages are so taken in their arrival order, each by the
receive MPI would give it to.

Probes (``iprobe``, ``probe``) must report a message's size, which only its header says, so a
probe that finds a message takes it in early: every message of that source up to it, in MPI's
order (header and array), into a *stash*.  Matching looks in the stash first: a source's stashed
messages arrived before any of its messages still in MPI's queue, so MPI's order holds.  A probe
first lets the posted receives take what they can: a message one of them will take is not the
probe's to report.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ..errors import UsageError
from ..runtime.status import ANY_SOURCE, ANY_TAG, Status
from .requests import RecvRequest
from .waiting import wait_for

__all__ = ["ReceiveMatching"]


class ReceiveMatching:
    """Mixed into ``MPIDevice`` (its ``comm``, ``rank``, clock, records and deferred self-sends)."""

    _posted: list[RecvRequest]

    def _complete(self, goal: RecvRequest, timeout: float | None) -> None:
        """Match messages to the posted receives until ``goal`` has one (``P2PTimeout`` past ``timeout``)."""
        budget, deadline = self._deadline(timeout)
        self._wait(lambda: goal.done, deadline,
                   lambda: self._p2p_timeout("recv from", goal.src, goal.tag, budget))

    def _wait(self, done: Any, deadline: float, on_timeout: Any) -> None:
        """``wait_for(done)``, taking messages for every posted receive meanwhile, as MPI matches a
        posted ``Irecv`` while its process waits on anything (a receive waited on before one posted
        after it, a large send after an ``irecv`` to a peer doing the same, a collective the sender
        of a large message has not reached)."""
        def poll() -> bool:
            if self._posted:
                self._match()
            return done()

        wait_for(poll, deadline, on_timeout)

    def _match(self) -> bool:
        """Take at most one message for the posted receives: the first that one of them, probed in
        posting order, finds waiting — for the earliest posted receive it fits, unless that
        receive's own probe finds another message first (an earlier one of that source, arrived
        between the probes, or of another source), which it takes instead: MPI's matching rule.
        Returns whether a message was taken."""
        for k, (source, tag, head, data) in enumerate(self._stash):  # (older than the queue's, per source)
            owner = next((r for r in self._posted if r.fits(source, tag)), None)
            if owner is not None:
                del self._stash[k]
                self._posted.remove(owner)
                self._deliver(owner, source, tag, head, data)
                return True
        st = MPI.Status()
        for req in self._posted:
            if self.comm.Iprobe(status=st, **req.which):
                source, tag = st.Get_source(), st.Get_tag()
                owner = self._first_fitting(source, tag)
                while owner is not req:  # an earlier receive: what is its own first message?
                    req = owner
                    self.comm.Iprobe(status=st, **req.which)  # (finds one at least: the one it fits)
                    source, tag = st.Get_source(), st.Get_tag()
                    # never later than req: it moves back, then stops
                    owner = self._first_fitting(source, tag)
                self._take(owner, source, tag)
                return True
        return False

    def _first_fitting(self, source: int, tag: int) -> RecvRequest:
        return next(r for r in self._posted if r.fits(source, tag))

    def _take(self, req: RecvRequest, source: int, tag: int) -> None:
        """Receive the next message from ``source`` with ``tag`` (probed: it has arrived) into ``req``."""
        head = self.comm.recv(source=source, tag=tag)
        self._posted.remove(req)
        self._deliver(req, source, tag, head, None)

    def _deliver(self, req: RecvRequest, source: int, tag: int, head: tuple, data: np.ndarray | None) -> None:
        """Complete ``req`` with the message whose header is ``head`` (an array message's array:
        ``data`` if a probe took it in already, else received here)."""
        out, error = req.out, None
        if head[0] == "object":
            value, stamp, nbytes = head[1:]  # the pickle's bytes, as the emulator's receive charges them
            if out is not None:
                error = UsageError("recv(out=...) needs an array message, but the "
                                   "sender sent a pickled object")
        else:
            shape, dtype = tuple(head[1]), np.dtype(head[2])
            fits = out is not None and out.shape == shape and out.dtype == dtype
            if data is None:
                value = out if fits else np.empty(shape, dtype)
                # (taken in any case: the next message must not find it)
                self.comm.Recv(value, source=source, tag=tag)
            elif fits:
                value = out
                np.copyto(out, data)
            else:
                value = data
            nbytes, stamp = value.nbytes, head[3]
            if out is not None and not fits:  # the emulator's check, raised by this receive's wait()
                error = UsageError(f"recv buffer has shape {tuple(out.shape)} and dtype "
                                   f"{out.dtype}, but the message "
                                   f"holds shape {shape} and dtype {dtype}")
        req.value, req.error, req.done = value, error, True
        req._status.source, req._status.tag, req._status.nbytes = source, tag, nbytes
        self._clock.on_recv(source, nbytes, stamp)
        self._record("recv", "recv", *req.t0, nbytes, peer=source)
        if source == self.rank:  # complete the deferred sends to ourselves that this receive let finish
            # (a nested wait may take another message to ourselves)
            deferred, self._to_self = self._to_self, []
            for sent in deferred:
                if sent.test():
                    sent.wait()
                else:  # another message to ourselves, not received yet: waiting on it would wait forever
                    self._to_self.append(sent)

    # -- probes ---------------------------------------------------------------------------------------
    def iprobe(self, src: int = ANY_SOURCE, tag: int = ANY_TAG) -> Status | None:
        """The status of the message ``recv(src, tag)`` would take now, left for it; None if none
        has arrived (see the module doc)."""
        src, tag = self._peer(src, tag, "src")
        while self._posted and self._match():  # what a posted receive will take is not the probe's
            pass
        for source, t, head, _ in self._stash:
            if src in (source, ANY_SOURCE) and tag in (t, ANY_TAG):
                return _status(source, t, head)
        st = MPI.Status()
        if not self.comm.Iprobe(source=MPI.ANY_SOURCE if src == ANY_SOURCE else src,
                                tag=MPI.ANY_TAG if tag == ANY_TAG else tag, status=st):
            return None
        source, found = st.Get_source(), st.Get_tag()
        while True:  # that source's messages, in MPI's order, up to the one found
            self.comm.Probe(source=source, tag=MPI.ANY_TAG, status=st)
            t = st.Get_tag()
            head = self.comm.recv(source=source, tag=t)
            data = None
            if head[0] == "array":
                data = np.empty(tuple(head[1]), np.dtype(head[2]))
                self.comm.Recv(data, source=source, tag=t)
            self._stash.append((source, t, head, data))
            if t == found:
                return _status(source, t, head)

    def probe(self, src: int = ANY_SOURCE, tag: int = ANY_TAG, timeout: float | None = None) -> Status:
        """Wait until ``iprobe(src, tag)`` finds a message; its status (``P2PTimeout`` past ``timeout``)."""
        budget, deadline = self._deadline(timeout)
        found: list[Status | None] = [None]

        def arrived() -> bool:
            found[0] = self.iprobe(src, tag)
            return found[0] is not None

        wait_for(arrived, deadline, lambda: self._p2p_timeout("probe for a message from", src, tag, budget))
        return found[0]


def _status(source: int, tag: int, head: tuple) -> Status:
    """A message's status from its header: an object's pickled bytes, or the array's bytes."""
    nbytes = head[3] if head[0] == "object" else int(np.prod(head[1],
                                                             dtype=np.int64)) * np.dtype(head[2]).itemsize
    return Status(source, tag, nbytes)
