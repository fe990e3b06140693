"""Messages a device sends to itself, as MPI allows (generic ring code at world size 1 needs them).

They never touch a channel: a send to oneself hands a private copy (arrays copied, other objects
pickled and unpickled, so the receiver never aliases the sender's object) to the device's own
endpoint, which matches it exactly as a message from a peer (``Endpoint.deliver_to_self``): to the
earliest-posted receive that takes it — from this device or from ``ANY_SOURCE``, with its tag or
``ANY_TAG`` — else it waits, FIFO per tag, for the next such receive.  A receive that only this
device could complete and that is still unmatched when it must complete would wait forever, so it
raises instead (:func:`would_wait_forever`).  No bytes are counted and no modelled time is charged:
no link is crossed.  A message still queued when a run ends is reported like any unreceived
message, and a reset drops it: it never reaches a later run.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import UsageError
from ..transport.leftovers import withdraw
from ..transport.payload import dumps_by_value, plain_array

if TYPE_CHECKING:  # pragma: no cover
    from .core import DeviceCore

__all__ = ["SelfSend", "send_to_self", "would_wait_forever"]


def _copy(x: Any) -> tuple[Any, int]:
    """A private copy of ``x`` and the bytes a peer would receive (an array's, or its pickle's)."""
    if plain_array(x):  # a subclass (a masked array) is pickled, as a message to a peer would be
        return np.array(x, copy=True), x.nbytes
    data = dumps_by_value(x)  # a class the run brought by value, too
    return pickle.loads(data), len(data)


def send_to_self(core: "DeviceCore", x: Any, tag: int, blocking: bool = False,
                 sync: bool = False) -> "SelfSend":
    """Queue a copy of ``x`` for this device's own receive; returns the send's request.  A blocking
    send that must wait for its receive (``ssend``; in strict mode, a send above ``eager_limit``)
    completes only if that receive is already posted: else only this device could post it, after
    the send returned, so it is raised at once, as MPI would hang there.  An ``issend``'s request
    is done once a receive took the message."""
    slot = core.begin_op(*core.texts.send(x, core.rank, tag, "ssend" if sync else "send"))
    copy, nbytes = _copy(x)
    limit = core.endpoint.eager_limit
    waits = sync or limit is not None and nbytes > limit  # for its receive (ssend; strict mode)
    msg = core.endpoint.deliver_to_self(tag, copy, nbytes, posted_only=blocking and waits)
    if msg is None:
        core.fail(slot)
        verb, why = ("ssend", "synchronous") if sync else ("send", f"above eager_limit={limit}")
        raise UsageError(f"{core.name}: {verb} to itself (tag {tag}) of {nbytes} bytes at op "
                         f"#{core.op_seq} is {why}: it waits for its receive, none is posted, and only this "
                         "device could post one once the send returned, so it would wait forever (use isend, "
                         "then recv)",
                         rank=core.rank, tag=tag)
    core.recorder.finish(slot, core.clock.now)
    return SelfSend(tag, msg if waits and not blocking else None, "issend" if sync else "isend")


def would_wait_forever(core: "DeviceCore", inner: Any, tag: int) -> UsageError:
    """The error of a receive from this device itself that nothing queued can complete; the
    receive is withdrawn, so it cannot take a later message."""
    withdraw(core.endpoint, inner)
    return UsageError(f"{core.name}: recv from itself (tag {'any' if tag < 0 else tag}) at op #{core.op_seq} "
                      "has no message: no send to itself with that tag is queued, so it would wait forever",
                      rank=core.rank, tag=tag)


class SelfSend:
    """What ``isend`` to oneself returns: complete at once (the message is already queued); for an
    ``issend`` (or an ``isend`` above ``eager_limit``), once a receive of this device took the
    message (``msg``: its receive request, which a receive claims), and waiting before that is an
    error at once, as only this device could take it."""

    status = None

    def __init__(self, tag: int, msg: Any = None, verb: str = "isend") -> None:
        self._tag, self._msg, self._verb = tag, msg, verb

    def test(self) -> bool:
        return self._msg is None or self._msg.claimed

    def wait(self, timeout: float | None = None) -> None:
        if not self.test():
            raise UsageError(f"{self._verb} to itself (tag {self._tag}): no receive of this device has "
                             "taken it, and only this device could, so waiting would wait forever (post the "
                             "receive first)", tag=self._tag)
        return None

    def __repr__(self) -> str:
        return f"<Request send self tag={self._tag} {'done' if self.test() else 'pending'}>"
