"""Point-to-point ops of a device: ``isend``, ``irecv``, ``send``, ``recv``, and their bookkeeping.

A mixin of :class:`~virtualpar.runtime.device.VirtualDevice`: it checks the arguments against the
device's identity and does the rest through the device's :class:`~.core.DeviceCore` (``self._core``).
Every op is counted (``op #N``), recorded in the flight recorder, and charged to the modelled clock
in program order (``DeviceCore.sent``, ``DeviceCore.received``), the bookkeeping collectives and
requests share.

Cost of an op beyond the transport: a handful of type checks, one flight-recorder write at start
and one at the end, the modelled-clock update (route figures cached per peer in the clock).  The
flight-recorder text of a send or receive is formatted once per (peer, tag, shape, dtype) and
reused (formatting a dtype alone costs ~2 µs).  Trace events and their flow ids are built only when
``trace`` is on.  ``send``/``recv`` skip the request handle of ``isend``/``irecv``, and a plain
``send`` is recorded just after it is posted, so the record's write overlaps with the receiver's
work instead of delaying the message: a 4 KiB one-way message costs ~2 µs above the transport.
With ``trace`` on (the default) a send or receive also appends one tuple to the device's event
log; its flow id stays a tuple of ints until the trace is read.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import P2PTimeout, UsageError
from ..transport.leftovers import withdraw
from .loopback import SelfSend, send_to_self, would_wait_forever
from .requests import Request
from .status import ANY_SOURCE, ANY_TAG, Status, plain_int

if TYPE_CHECKING:  # pragma: no cover
    from .core import DeviceCore

_TAG_END = 1 << 63  # a message header holds a signed 64-bit tag
_SEND_STAYS = (" The message stays posted: it is still delivered if its receive comes, so do not send it"
               " again.")
_RECV_WITHDRAWN = " The receive is withdrawn: a message arriving later is left for the next receive."
_RECV_LOST = " It had begun to take a message still arriving: that message is lost to later receives."

__all__ = ["PointToPoint", "ANY_SOURCE", "ANY_TAG", "Status", "tag_span"]


def tag_span(tag: Any) -> tuple[range | None, Any]:
    """A ``range`` of tags (the mpi4py facade's ANY_TAG within one communicator's span of device
    tags) is received as ANY_TAG restricted to it; any other tag is as given."""
    if type(tag) is range and tag.step == 1 and 0 <= tag.start < tag.stop <= _TAG_END:
        return tag, ANY_TAG
    return None, tag


class PointToPoint:
    """Point-to-point messages between the devices of a cluster (see the module doc)."""

    _core: "DeviceCore"
    rank: int
    size: int
    name: str

    def isend(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> Request:
        """Start sending ``x`` (an array travels raw; any other picklable object is pickled)."""
        return self._isend(x, dst, tag, timeout, False)

    def issend(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> Request:
        """Start a *synchronous* send (MPI's ``Issend``): complete only once a matching receive has
        taken ``x``, whatever its size and ``eager_limit``."""
        return self._isend(x, dst, tag, timeout, True)

    def ssend(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> None:
        """Send ``x`` and return only once a matching receive has taken it (MPI's ``Ssend``): a
        program that completes with ``ssend`` in place of ``send`` does not rely on buffering."""
        self._isend(x, dst, tag, timeout, True, blocking=True).wait()

    def _isend(self, x: Any, dst: int, tag: int, timeout: float | None, sync: bool,
               blocking: bool = False) -> Request | SelfSend:
        core = self._core
        if type(dst) is not int or not 0 <= dst < self.size or dst == self.rank \
                or type(tag) is not int or not 0 <= tag < _TAG_END:
            dst, tag = plain_int(dst), plain_int(tag)
            if self._check_p2p(dst, tag, "dst"):  # the fast test above passes plain valid ints only
                return send_to_self(core, x, tag, blocking, sync)
        budget = core.timeout if timeout is None else core.budget(timeout)
        slot = core.begin_op(*core.texts.send(x, dst, tag, "ssend" if sync else "send"))
        wall0 = time.monotonic()
        deadline = wall0 + budget
        try:  # posting a large message takes a while
            inner, flow = core.post_send(x, dst, tag, sync)
        except BaseException:  # a send that cannot be posted is recorded as failed
            core.fail(slot)
            raise
        return Request(core, inner, "send", dst, tag, deadline, None, slot, flow, budget, wall0)

    def irecv(self, src: int, tag: int = 0, out: np.ndarray | None = None,
              timeout: float | None = None) -> Request:
        """Start receiving the next message from ``src`` with ``tag`` (into ``out`` if given);
        ``src=ANY_SOURCE`` / ``tag=ANY_TAG`` take the earliest matching message this device has
        taken in from its channels (not necessarily the earliest sent, as MPI allows; the request's
        ``status`` then says who sent it, with which tag)."""
        span = None
        if type(src) is not int or type(tag) is not int:
            span, tag = tag_span(tag)
            src, tag = plain_int(src), plain_int(tag)
        core = self._core
        budget, slot = self._begin_recv(core, src, tag, out, timeout)
        deadline = time.monotonic() + budget
        inner = core.endpoint.irecv(None if src == ANY_SOURCE else src,
                                    span if span is not None else None if tag == ANY_TAG else tag, out)
        return Request(core, inner, "recv", src, tag, deadline, None, slot, None, budget)

    def send(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> None:
        """Send ``x`` to device ``dst``; returns once the message is on its way (buffered).

        The same op as ``isend(x, dst, tag).wait()``, minus the handle.  Unless a fault is
        injected, the op is recorded just *after* it is posted: the flight-recorder write then
        overlaps with the receiver's work instead of delaying the message (a small send is
        complete once posted, so no reader can see it pending in between).
        """
        core = self._core
        if type(dst) is not int or not 0 <= dst < self.size or dst == self.rank \
                or type(tag) is not int or not 0 <= tag < _TAG_END:
            dst, tag = plain_int(dst), plain_int(tag)
            if self._check_p2p(dst, tag, "dst"):
                send_to_self(core, x, tag, blocking=True)
                return
        budget = core.timeout if timeout is None else core.budget(timeout)
        if core.faults:
            self.isend(x, dst, tag, budget).wait()  # a fault due at this op fires before anything is posted
            return
        trace = core.trace
        wall0 = time.monotonic() if trace else 0.0
        ep = core.endpoint
        try:
            inner = ep.isend(x, dst, tag, on_send=core.clock.on_send)
        except BaseException:
            core.fail(core.begin_op(*core.texts.send(x, dst, tag)))
            raise
        slot = core.begin_op(*core.texts.send(x, dst, tag))
        if not inner.done:
            core.wait(inner, slot, budget, lambda: core.p2p_error("send to", dst, tag, budget, _SEND_STAYS))
        core.sent(dst, inner, slot, wall0, (self.rank, dst, inner.seq, ep.resets) if trace else None)

    def recv(self, src: int, tag: int = 0, out: np.ndarray | None = None, timeout: float | None = None,
             status: Status | None = None) -> Any:
        """Receive the next message from device ``src`` with ``tag``; FIFO per (src, tag).

        The same op as ``irecv(src, tag, out).wait()``, without the handle.  ``src=ANY_SOURCE`` /
        ``tag=ANY_TAG`` take the earliest message that matches of those taken in from the channels
        (MPI does not order sources either); pass a :class:`Status` to learn
        its source, tag and size."""
        span = None
        if type(src) is not int or type(tag) is not int:
            span, tag = tag_span(tag)
            src, tag = plain_int(src), plain_int(tag)
        core = self._core
        budget, slot = self._begin_recv(core, src, tag, out, timeout)
        wall0, model0 = (time.monotonic(), core.clock.now) if core.trace else (0.0, 0.0)
        ep = core.endpoint
        if src < 0 or tag < 0:  # ANY_SOURCE / ANY_TAG (_begin_recv let nothing else through)
            inner = ep.irecv(None if src == ANY_SOURCE else src,
                             span if span is not None else None if tag == ANY_TAG else tag, out)
        else:
            inner = ep.irecv(src, tag, out)
        if (src == self.rank or src == ANY_SOURCE and self.size == 1) and not inner.done:
            core.fail(slot)  # only this device could send it
            raise would_wait_forever(core, inner, tag)
        try:
            value = core.wait(inner, slot, budget,
                              lambda: core.p2p_error("recv from", src, tag, budget, _RECV_WITHDRAWN))
        except P2PTimeout as exc:
            if not withdraw(ep, inner):  # nobody holds it now: it must not swallow a later message
                raise exc.replace(exc.message.replace(_RECV_WITHDRAWN, _RECV_LOST)) from None
            raise
        core.received(inner, slot, wall0, model0)
        if status is not None:
            status.fill(inner)
        return value

    def sendrecv(self, x: Any, dst: int, src: int, sendtag: int = 0, recvtag: int | None = None,
                 timeout: float | None = None) -> Any:
        """Send ``x`` to ``dst`` and receive from ``src`` at once (MPI's ``Sendrecv``): the receive
        is posted first, so a ring of sendrecvs never deadlocks; ``recvtag`` defaults to ``sendtag``."""
        incoming = self.irecv(src, sendtag if recvtag is None else recvtag, timeout=timeout)
        outgoing = self.isend(x, dst, sendtag, timeout=timeout)
        value = incoming.wait()
        outgoing.wait()
        return value

    def _begin_recv(self, core: "DeviceCore", src: int, tag: int, out: Any,
                    timeout: float | None) -> tuple[float, int]:
        """Check a receive's arguments, count and record it; returns (its budget in s, its record slot)."""
        self._check_recv(src, tag)
        if out is not None:
            self._check_out(out)
        budget = core.timeout if timeout is None else core.budget(timeout)
        return budget, core.begin_op(*core.texts.recv(src, tag))

    # -- argument checks (probing's too) ----------------------------------------------------------
    def _check_recv(self, src: Any, tag: Any) -> None:
        """Raise ``UsageError`` for a receive's (or a probe's) bad source or tag; ``ANY_SOURCE``,
        ``ANY_TAG`` and this device itself are allowed."""
        if type(src) is not int or not 0 <= src < self.size or src == self.rank \
                or type(tag) is not int or not 0 <= tag < _TAG_END:
            any_src = type(src) is int and src == ANY_SOURCE
            any_tag = type(tag) is int and tag == ANY_TAG
            if not any_src:
                self._check_p2p(src, 0 if any_tag else tag, "src")  # from this device itself is allowed
            if any_src and not any_tag:
                self._check_p2p(0 if self.rank else self.size - 1, tag, "src")  # the tag's own check

    def _check_p2p(self, peer: Any, tag: Any, what: str) -> bool:
        """Raise ``UsageError`` for a bad peer rank or tag (the callers' fast test failed); True
        if the peer is this device itself (a message to oneself, see :mod:`.loopback`)."""
        if isinstance(peer, (bool, np.bool_)) or not isinstance(peer, (int, np.integer)):
            raise UsageError(f"{self.name}: {what} must be a device rank (int), got {peer!r}")
        if not 0 <= peer < self.size:
            raise UsageError(f"{self.name}: {what}={peer} is out of range; ranks are 0..{self.size - 1}")
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or not 0 <= tag < _TAG_END:
            raise UsageError(f"{self.name}: tag must be an int in 0..2**63-1 (a message header holds 64 "
                             f"bits), got {tag!r}")
        return peer == self.rank

    def _check_out(self, out: Any) -> None:
        if not isinstance(out, np.ndarray):
            raise UsageError(f"{self.name}: recv(out=...) needs a numpy array, got {type(out).__name__}")
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise UsageError(f"{self.name}: recv(out=...) needs a writeable C-contiguous array")
