"""Shuffled mode: timing perturbed deterministically from a seed, so that races show up in tests.

``VirtualCluster(shuffle=seed)`` gives every device endpoint a :class:`Shuffle` seeded with
``(seed, rank)``.  Before each send and each receive is posted the endpoint asks it for a delay:
with probability ``P_DELAY`` a uniform pause of up to ``MAX_DELAY`` seconds, else none.  The
sequence of pauses of a device depends only on the seed and on its own sequence of ops, so the
same seed replays the same perturbation (the OS scheduler still adds its own noise; the seed
reproduces the part we add).  A program whose result depends on arrival order then gives
different results for different seeds, which a test sweeping a few seeds catches.

:meth:`Shuffle.order` is the hook for any-source receives (``transport/wildcard.py``): given the
sources with a ready message, it returns them in a seeded order, the first to be delivered first.
Its draws come from a generator of their own, so the pauses replay whatever arrives; the order
replays whenever the same sources are ready, as when they sent before a barrier.  Control traffic
(the runtime's own messages) is never delayed.  Off (no ``shuffle``), the endpoint's hot path
pays one ``is None`` test.
"""

from __future__ import annotations

import random
import time
from typing import Sequence

__all__ = ["Shuffle", "MAX_DELAY", "P_DELAY"]

MAX_DELAY = 300e-6  # longest pause before a send or receive
P_DELAY = 0.5  # share of ops that pause at all


class Shuffle:
    """Device ``rank``'s seeded source of pauses and delivery orders."""

    def __init__(self, seed: int, rank: int, max_delay: float = MAX_DELAY, p_delay: float = P_DELAY) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"shuffle seed must be an int, got {seed!r}")
        self.seed = seed
        self.rank = rank
        self._rng = random.Random(f"{seed}/{rank}")
        self._order_rng = random.Random(f"{seed}/{rank}/order")  # apart, so pauses replay whatever arrives
        self.max_delay = max_delay
        self.p_delay = p_delay

    def delay(self) -> float:
        """The next pause in seconds (0.0 for most ops); drawn whether or not it is slept."""
        rng = self._rng
        if rng.random() < self.p_delay:
            return rng.uniform(0.0, self.max_delay)
        return 0.0

    def pause(self) -> None:
        """Sleep the next pause (the endpoint calls this before posting a send or a receive)."""
        d = self.delay()
        if d > 0.0:
            time.sleep(d)

    def order(self, sources: Sequence[int]) -> list[int]:
        """``sources`` (of ready messages) in the seeded order in which to deliver them."""
        out = list(sources)
        self._order_rng.shuffle(out)
        return out
