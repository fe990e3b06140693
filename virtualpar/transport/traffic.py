"""What a device's shared-memory collectives owe the traffic counters, folded in once per command.

The traffic counters are words in the arena (bytes and messages per ordered device pair), which
the driver reads for ``cluster.stats()``.  A message bumps its pair's two words as it is sent (two
memoryview additions).  A shared-memory collective instead counts, per call, what every other
member of its group read of ours — the same for every peer, or one count per member — which on the
counters is an addition to every peer's word: two numpy fancy-indexed additions over the group, a
few µs warm but ~12 µs each when the caches have gone cold, as they have after every wake-up with
more devices than cores (one float all_reduce at 64 devices on two cores: ~15% of a device's CPU).

So a call only adds to a tally kept per group here (``add``: Python integers, or one numpy
addition for per-member counts), and the device folds the tallies into the counters when its
command ends, before it replies to the driver (``settle``).  ``cluster.stats()`` reads the counters
between commands, when nothing is owed; read while a command still runs, they do not show that
command's shared-memory collectives yet.  A device killed in a command loses what it owed for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["OwedTraffic"]


class OwedTraffic:
    """The bytes and messages each group's peers read of this device, not yet on the counters."""

    __slots__ = ("_bytes", "_msgs", "_owed")

    def __init__(self, bytes_row: np.ndarray, msgs_row: np.ndarray) -> None:
        self._bytes, self._msgs = bytes_row, msgs_row  # this device's row of each counter
        # group -> [bytes to every peer, messages to every peer, per-member bytes]
        self._owed: dict[Any, list] = {}

    def add(self, grp: Any, nbytes: Any, messages: int) -> None:
        """Every peer of ``grp`` (a ``FenceGroup``: ``peers`` their ranks, ``others`` their positions)
        read ``nbytes`` of ours — an int, or one count per member in group order, ours ignored — in
        ``messages`` messages."""
        owed = self._owed.get(grp)
        if owed is None:
            owed = self._owed[grp] = [0, 0, None]
        if type(nbytes) is int:
            owed[0] += nbytes
        elif owed[2] is None:
            owed[2] = np.array(nbytes, dtype=np.int64)
        else:
            owed[2] += nbytes
        owed[1] += messages

    def settle(self) -> None:
        """Add everything owed to the counters."""
        for grp, (nbytes, messages, per_member) in self._owed.items():
            peers = grp.peers
            if per_member is not None:
                self._bytes[peers] += per_member[grp.others] + nbytes
            elif nbytes:
                self._bytes[peers] += nbytes
            if messages:
                self._msgs[peers] += messages
        self._owed.clear()
