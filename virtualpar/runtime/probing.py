"""Waiting for any of several requests, and looking at a message before receiving it: a mixin of
:class:`~virtualpar.runtime.device.VirtualDevice` (the device protocol's ``wait_any``, ``iprobe``
and ``probe``; MPI's ``Waitany`` and ``Iprobe``/``Probe``).

A probe reports the source, tag and size of the message a receive with the same source and tag
would take now, and leaves it where it is: the earliest-arrived one that matches among those this
device has taken in from its channels (every byte already in a ring is pulled in first), never one
a receive posted earlier will take (that one is matched as it arrives).  A receive right after it
with the same source and tag takes that very message, as MPI promises, in shuffled mode too (the
seed's pick is kept for it).  Probes are not ops: they are neither counted nor recorded, and cost
no modelled time (the receive that follows is charged the message's arrival, as any receive is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ..errors import P2PTimeout, UsageError
from ..transport.wildcard import peek
from ..transport.waitboard import AnyOf
from .loopback import SelfSend
from .p2p import tag_span
from .requests import Request
from .status import ANY_SOURCE, ANY_TAG, Status, plain_int

if TYPE_CHECKING:  # pragma: no cover
    from .core import DeviceCore

__all__ = ["Probing"]


class _Probe:
    """What a blocking probe waits for, as the wait board and a timeout error describe it: a
    receive of ``src`` (None: any) and ``tag`` (None: any; a range: any within it)."""

    __slots__ = ("src", "tag")

    def __init__(self, src: int | None, tag: Any) -> None:
        self.src, self.tag = src, tag

    def __str__(self) -> str:
        tag = "any" if self.tag is None or type(self.tag) is range else self.tag
        return f"a message from {'any source' if self.src is None else self.src} (tag {tag}) to probe"


class Probing:
    """``wait_any``, ``iprobe`` and ``probe`` (see the module doc), over the device's core (its endpoint)
    and the receive's argument checks (``PointToPoint._check_recv``)."""

    _core: "DeviceCore"
    rank: int
    index: Any
    name: str
    _check_recv: Callable[[Any, Any], None]

    def wait_any(self, requests: Any, timeout: float | None = None) -> int:
        """Block until one of ``requests`` (this device's) can complete; the index of the first that
        can, not completed (see ``Device.wait_any``).  The device sleeps meanwhile: whatever could
        complete one of them (a message, an answer, room in a ring) rings its doorbell, and each
        wake-up re-tests them all.  The deadlock detector sees it as a receive from anybody
        (``waitboard.AnyOf``): live while any device is, so a wait on peers that are themselves
        stuck is a ``Deadlock`` once everybody sleeps, and otherwise it ends at ``timeout`` (None:
        the device's default) in a ``P2PTimeout`` naming the requests."""
        core = self._core
        reqs = list(requests) if isinstance(requests, (list, tuple)) else None
        if not reqs or any(not (type(r) is Request and r._core is core or type(r) is SelfSend) for r in reqs):
            raise UsageError(f"{self.name}: wait_any needs a non-empty list of this device's requests (from "
                             f"isend, irecv or issend), got {requests!r}")
        budget = core.budget(timeout)
        found = [0]

        def ready() -> bool:  # (the wait made progress just before: nothing more to pull in per request)
            for i, r in enumerate(reqs):
                if r.ready if type(r) is Request else r.test():
                    found[0] = i
                    return True
            return False

        what = AnyOf(f"any of {len(reqs)} request{'s' * (len(reqs) > 1)}: {', '.join(map(repr, reqs[:4]))}"
                     f"{', ...' * (len(reqs) > 4)}")
        core.endpoint.wait(ready, budget, lambda: P2PTimeout(
            f"{self.name}: wait for {what} did not complete within {budget:g} s (op #{core.op_seq}).",
            rank=self.rank, index=str(self.index), op_seq=core.op_seq), what)
        return found[0]

    def iprobe(self, src: int = ANY_SOURCE, tag: int = ANY_TAG) -> Status | None:
        """The status (source, tag, bytes) of the message ``recv(src, tag)`` would take now, without
        taking it; None if there is none yet (MPI's ``Iprobe``)."""
        msg = peek(self._core.endpoint, *self._probe_key(src, tag))
        return None if msg is None else Status().fill(msg)

    def probe(self, src: int = ANY_SOURCE, tag: int = ANY_TAG, timeout: float | None = None) -> Status:
        """Block until ``iprobe(src, tag)`` finds a message, and return its status (MPI's ``Probe``);
        at most ``timeout`` s (None: the device's default), then ``P2PTimeout``.  The device sleeps
        meanwhile, and the deadlock detector sees the wait as the receive it probes for."""
        core = self._core
        key = self._probe_key(src, tag)
        budget = core.budget(timeout)
        found: list[Any] = [None]
        ep = core.endpoint

        def arrived() -> bool:
            found[0] = peek(ep, *key)
            return found[0] is not None

        what = _Probe(*key)
        ep.wait(arrived, budget, lambda: P2PTimeout(
            f"{self.name}: probe for {what} found none within {budget:g} s (op #{core.op_seq}).",
            rank=self.rank, index=str(self.index), peer=src, tag=tag, op_seq=core.op_seq), what)
        return Status().fill(found[0])

    def _probe_key(self, src: Any, tag: Any) -> tuple[int | None, Any]:
        """``(src, tag)`` as the endpoint matches them (None: any), checked as a receive's are."""
        span, tag = tag_span(tag)
        src, tag = plain_int(src), plain_int(tag)
        self._check_recv(src, tag)
        want = span if span is not None else None if tag == ANY_TAG else tag
        return None if src == ANY_SOURCE else src, want
