"""What a run leaves in an endpoint: messages nobody received, sends not finished, receives posted
and never matched (:func:`pending`, reported as ``UnmatchedMessages``), and taking back a receive
that gave up (:func:`withdraw`), so that it cannot swallow a later message."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from .channel import FLAG_CONTROL, FLAG_RENDEZVOUS, FLAG_RESENT, KIND_PICKLE
from .requests import SEND_NEW

if TYPE_CHECKING:  # pragma: no cover
    from .endpoint import Endpoint

__all__ = ["pending", "withdraw", "merge_ends", "IN_FLIGHT", "UNFINISHED_RECEIVE"]

UNFINISHED_RECEIVE = ("a receive posted and never matched (an irecv not waited on): it would take a later "
                      "run's message")
IN_FLIGHT = "still being sent"  # a send whose header left: its receiver lists the message too
_NOT_SENT = "not yet sent"  # a send still queued whole: nobody else lists it


def pending(ep: "Endpoint") -> list[tuple[int, int, int, str]]:
    """Messages not consumed by a receive, as (src, dst, tag, description); unfinished sends; and
    receives posted and not yet matched (src / tag -1: any), which would take a later message.
    A message both ends hold (its sender still sending, its receiver holding the header: offered
    or partly received) is listed by both; :func:`merge_ends` makes it one entry."""
    me, queues = ep.me, ep.queues
    out = [(src, me, tag, UNFINISHED_RECEIVE) for (src, tag), q in queues.posted.items() for _ in q]
    out += [(-1 if r.src is None else r.src, me, -1 if r.tag is None or type(r.tag) is range else r.tag,
             UNFINISHED_RECEIVE) for r in queues.posted_any]
    for (src, tag), q in queues.unexpected.items():
        for req in q:
            h = req.header
            desc = ("pickled object" if h and h.kind & 0xFF == KIND_PICKLE else
                    f"array{h.shape} {np.dtype(h.dtype)}" if h else "?")
            state = (" sent to itself" if src == me else "" if req.done else
                     " (offered, never taken)" if h and h.kind & FLAG_RENDEZVOUS and not req.expect else
                     " (partly received)")
            out.append((src, me, tag, desc + state))
    for dst, req in ep.unfinished_sends():
        if req.kind & FLAG_CONTROL:
            continue  # the runtime's own (an acknowledgement not written yet): no message of the program's
        where = IN_FLIGHT if req.state != SEND_NEW or req.kind & FLAG_RESENT else _NOT_SENT
        out.append((me, dst, req.tag, f"{req.nbytes} bytes {where}: an isend not waited on "
                                      "(its bytes move only while the sender waits or sends)"))
    return out


def merge_ends(found: list[tuple[int, int, int, str]]) -> list[tuple[int, int, int, str]]:
    """Every device's ``pending`` entries with each message once.  A send whose header left
    ("still being sent") is held by its receiver too, whole or in part: the receiver's entry
    stays, saying it came from an isend not waited on.  A message its receiver holds with no
    such sender entry (a blocking send that completed) is listed as it is."""
    def held(s: int, d: int, desc: str) -> bool:  # an entry of the receiver's, holding a message
        return desc != UNFINISHED_RECEIVE and IN_FLIGHT not in desc and _NOT_SENT not in desc and s != d

    received = Counter((s, d, t) for s, d, t, desc in found if held(s, d, desc))
    pairs = received & Counter((s, d, t) for s, d, t, desc in found if IN_FLIGHT in desc)
    drop, mark, out = Counter(pairs), Counter(pairs), []
    for s, d, t, desc in found:
        if IN_FLIGHT in desc and drop[(s, d, t)]:
            drop[(s, d, t)] -= 1
            continue
        if held(s, d, desc) and mark[(s, d, t)]:  # (a sender's "not yet sent" entry already says so)
            mark[(s, d, t)] -= 1
            desc += " from an isend not waited on"
        out.append((s, d, t, desc))
    return out


def withdraw(ep: "Endpoint", req: Any) -> bool:
    """Take back a receive its caller gave up on, so that it cannot swallow a message: one not
    matched yet leaves the posted queues; one whose message is still arriving hands that message
    back as the oldest unexpected one of its (source, tag), for the next receive to take in order.
    False only for a wildcard receive caught mid-message (its message is then lost to later ones)."""
    key, queues = (req.src, req.tag), ep.queues
    for queue in (queues.posted.get(key, ()), queues.posted_any):
        if req in queue:
            queue.remove(req)
            return True
    if req.done or req.header is None or req.src is None or req.tag is None:
        return req.done  # done: nothing was lost (its value is simply not returned)
    if req.out is not None:  # the bytes may be landing in the caller's buffer: the next taker copies them
        req.error = None  # an out= that did not fit was the abandoned receive's problem
    req.out, req.claimed, req.owed = None, False, 0  # (no receive took it: its sender is not told)
    queues.unexpected[key].appendleft(req)
    return True
