"""Receives from any source or with any tag (MPI's ``ANY_SOURCE`` / ``ANY_TAG``).

A wildcard receive (``src`` or ``tag`` None, or ``tag`` a ``range``: any tag within it) first takes
the *earliest-arrived* unexpected message it matches (each (source, tag) queue is FIFO, so only
queue heads compete; every unexpected message carries its arrival number); else it waits in
``posted_any``, in posting order (the endpoint's :class:`~.matching.MatchQueues`).  A frame that
arrives is matched to the earliest-posted receive that accepts it, a specific one or a
wildcard one (both carry their posting number) — MPI's non-overtaking rule.  Wildcards match only
user tags (>= 0): the runtime's own messages (negative tags) are never taken.  Which source an
any-source receive took shows in its header (``req.src`` is set to it).

In shuffled mode (``VirtualCluster(shuffle=seed)``) an any-source receive that finds ready
messages from several sources takes the source the seeded :meth:`Shuffle.order` puts first,
not the earliest arrival: a program that depends on arrival order then changes with the seed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .channel import FLAG_SYNC
from .rendezvous import acknowledge
from .requests import RecvRequest

if TYPE_CHECKING:  # pragma: no cover
    from .endpoint import Endpoint
    from .matching import MatchQueues

__all__ = ["irecv_any", "match_any", "peek"]


def _tag_ok(want: Any, tag: int) -> bool:
    """``want`` None (any user tag), a ``range`` of tags (any within it), or one tag."""
    return want is None or (tag in want if type(want) is range else want == tag)


def _accepts(req: RecvRequest, src: int, tag: int) -> bool:
    return tag >= 0 and (req.src is None or req.src == src) and _tag_ok(req.tag, tag)


def _earliest_per_source(queues: "MatchQueues", src: int | None,
                         tag: int | None) -> dict[int, tuple[Any, RecvRequest]]:
    """For each source with a matching unexpected message: (key, message) of its earliest arrival."""
    heads: dict[int, tuple[Any, RecvRequest]] = {}
    for key, waiting in queues.unexpected.items():
        if waiting and key[1] >= 0 and (src is None or key[0] == src) and _tag_ok(tag, key[1]):
            held = heads.get(key[0])
            if held is None or waiting[0].order < held[1].order:
                heads[key[0]] = (key, waiting[0])
    return heads


def _pick(ep: "Endpoint", src: int | None, tag: int | range | None) -> tuple[Any, RecvRequest | None]:
    """(key, message) of the unexpected message a receive of ``src`` and ``tag`` takes now, or
    (None, None)."""
    queues = ep.queues
    if src is not None and tag is not None and type(tag) is not range:
        waiting = queues.unexpected.get((src, tag))
        return ((src, tag), waiting[0]) if waiting else (None, None)
    heads = _earliest_per_source(queues, src, tag)
    if len(heads) > 1 and ep.shuffle is not None:  # shuffled mode: the seed picks among the sources
        probed = queues.probed
        if probed is not None and heads.get(probed[1].src) == probed:  # what a probe just reported: that one
            return probed
        return heads[ep.shuffle.order(sorted(heads))[0]]
    if heads:  # the earliest arrival; one source's messages always in the order they were sent
        return min(heads.values(), key=lambda kv: kv[1].order)
    return None, None


def peek(ep: "Endpoint", src: int | None, tag: int | range | None) -> RecvRequest | None:
    """The message a receive of ``src`` and ``tag`` would take now, left where it is (MPI's
    ``Iprobe``), or None.  In shuffled mode the seed's pick is kept for the next receive that
    could take it, so that a probe and the receive after it agree, as MPI promises."""
    ep.progress()  # every message already in a ring counts
    key, msg = _pick(ep, src, tag)
    ep.queues.probed = None if msg is None or ep.shuffle is None else (key, msg)
    return msg


def irecv_any(ep: "Endpoint", src: int | None, tag: int | range | None, out: Any) -> RecvRequest:
    if ep.shuffle is not None:
        ep.progress()  # every message already in a ring competes, not only those drained so far
    queues = ep.queues
    best_key, best = _pick(ep, src, tag)
    queues.probed = None  # (kept for this receive only)
    if best is not None:
        queues.unexpected[best_key].popleft()
        best.out = out
        best.claimed = True
        if best.header is not None and best.header.kind & FLAG_SYNC:  # strict mode / Issend: it waits for us
            acknowledge(ep, best)
        return best
    req = RecvRequest(ep, src, tag, out)
    req.order = queues.order = queues.order + 1
    queues.posted_any.append(req)
    ep.progress()
    return req


def match_any(queues: "MatchQueues", src: int, tag: int, specific: RecvRequest | None) -> RecvRequest | None:
    """The wildcard receive that takes a frame from ``src`` with ``tag``, if one was posted before
    ``specific`` (the head of that key's posted queue, or None); it leaves ``posted_any``."""
    posted_any = queues.posted_any
    for i, req in enumerate(posted_any):
        if _accepts(req, src, tag):
            if specific is not None and specific.order < req.order:
                return None
            del posted_any[i]
            req.src, req.tag = src, tag
            return req
    return None
