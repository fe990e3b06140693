"""Wildcards for receives and the status of a completed receive (MPI's ``ANY_SOURCE``,
``ANY_TAG`` and ``Status``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ANY_SOURCE", "ANY_TAG", "Status", "plain_int"]

ANY_SOURCE = -1  # recv(src=ANY_SOURCE): from whichever device's matching message came first
ANY_TAG = -1  # recv(tag=ANY_TAG): any user tag (the runtime's own messages are never taken)


def plain_int(v: Any) -> Any:
    """A rank or tag from numpy (``np.arange``, ``np.roll``) as a plain int, as mpi4py takes them;
    anything else unchanged, for the argument checks to judge."""
    return int(v) if type(v) is not int and isinstance(v, np.integer) else v


@dataclass
class Status:
    """Who sent a received message, with which tag, how many payload bytes."""

    source: int = -1
    tag: int = -1
    nbytes: int = 0

    def fill(self, inner: Any) -> "Status":
        self.source, self.tag, self.nbytes = int(inner.src), int(inner.tag), int(inner.nbytes)
        return self
