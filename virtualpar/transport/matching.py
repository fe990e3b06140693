"""``MatchQueues``: an endpoint's matching state, the one object its matching code shares.

MPI's matching in three containers and a counter: receives posted and not matched yet, FIFO per
(source, tag) (``posted``) or, for a wildcard receive (any source, any tag, a range of tags), in
posting order (``posted_any``); messages that arrived before a receive asked for them, FIFO per
(source, tag) (``unexpected``); and ``order``, which numbers the receives as they are posted and
the unexpected messages as they arrive, so that a wildcard receive takes the earliest (see
:mod:`.wildcard`).  The progress engine (:mod:`.receiving`), ``Endpoint.irecv``, the wildcard
receives, rendezvous offers held for their receive (:mod:`.rendezvous`) and the end-of-run report
(:mod:`.leftovers`) read and change these; nothing else does.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .requests import RecvRequest

__all__ = ["MatchQueues"]


class MatchQueues:
    """Receives waiting for messages and messages waiting for receives, at one endpoint."""

    __slots__ = ("posted", "posted_any", "unexpected", "order", "probed")

    def __init__(self) -> None:
        self.posted: defaultdict[tuple[int, int], deque[RecvRequest]] = defaultdict(deque)
        self.posted_any: list[RecvRequest] = []  # receives from any source / with any tag, in posting order
        self.unexpected: defaultdict[tuple[int, int], deque[RecvRequest]] = defaultdict(deque)
        self.order = 0  # numbers receives as posted and unexpected messages as they arrive
        self.probed: tuple[Any, RecvRequest] | None = None  # (key, message) the last probe reported (peek)

    def clear(self) -> None:
        """Forget every receive and message (a reset).  The containers stay the same objects."""
        self.posted.clear()
        self.posted_any.clear()
        self.unexpected.clear()
        self.probed = None
