"""``Lazy``: a dict that builds each value the first time its key is read.

A device of an n-device cluster can reach n peers, but most programs talk to a few (a ring, a
mesh axis).  Building every peer's channel, fence slots, flight-recorder view and scratch view at
start-up cost ~30 ms of CPU and ~3 MiB per device at 256 devices — 8 s of start-up on two cores —
for objects most devices never touch.  ``Lazy(factory)`` builds ``factory(key)`` on the first
``lazy[key]`` and keeps it; every later read is a plain dict lookup (``__missing__`` runs only on
a miss), so the hot paths pay nothing for the laziness.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["Lazy"]


class Lazy(dict):
    """``lazy[key]`` is ``factory(key)``, built on first use and kept."""

    __slots__ = ("_factory",)

    def __init__(self, factory: Callable[[Any], Any]) -> None:
        super().__init__()
        self._factory = factory

    def __missing__(self, key: Any) -> Any:
        value = self[key] = self._factory(key)
        return value
