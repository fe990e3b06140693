"""Wildcards for receives and the status of a completed receive (MPI's ``ANY_SOURCE``,
``ANY_TAG`` and ``Status``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ANY_SOURCE", "ANY_TAG", "Status"]

ANY_SOURCE = -1  # recv(src=ANY_SOURCE): from whichever device's matching message came first
ANY_TAG = -1  # recv(tag=ANY_TAG): any user tag (the runtime's own messages are never taken)


@dataclass
class Status:
    """Who sent a received message, with which tag, how many payload bytes."""

    source: int = -1
    tag: int = -1
    nbytes: int = 0

    def fill(self, inner: Any) -> "Status":
        self.source, self.tag, self.nbytes = int(inner.src), int(inner.tag), int(inner.nbytes)
        return self
