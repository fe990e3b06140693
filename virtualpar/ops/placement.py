"""Which clusters hold an operation's state: one piece of bookkeeping for every operation.

An operation that leaves something on a cluster's devices — placed weights, a planned step, the
records of its last step — must know which clusters hold it, and must never confuse them: a
second cluster starts from nothing, and a closed cluster (whose ``id`` Python may give to the next
one) holds nothing any more.  ``PlacedOperation`` keeps, per cluster, a small dict of what the
operation left there, keyed **weakly** by the cluster object, so a cluster that is gone drops out
by itself.

    class MyOp(PlacedOperation):
        def execute_on(self, cluster, x):
            if not self.is_placed_on(cluster):
                cluster.run(place_weights, ...)        # first run here: put the state on the devices
                self.hold(cluster, steps=0)            # ...and remember that this cluster holds it
            self.state_for(cluster)["steps"] += 1

The API: ``hold(cluster, **values)`` records that the operation now holds state on ``cluster``
(and updates its dict), ``state_for(cluster)`` is that dict (``None`` where it holds nothing),
``is_placed_on(cluster)``, ``forget(cluster)`` (drops the record, returns it) and
``placed_clusters()``.  A copy (``copy.copy``, ``copy.deepcopy``, pickling, ``dataclasses.replace``)
starts with no clusters: it is an operation of its own and must not believe it holds the
original's state.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["ClusterState", "PlacedOperation"]

_ATTR = "_cluster_state"  # where a PlacedOperation keeps its ClusterState (made on first use)


class ClusterState:
    """cluster -> dict of what an operation left on it, held weakly (a collected cluster drops out)."""

    def __init__(self) -> None:
        self._by: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def hold(self, cluster: Any, **values: Any) -> dict[str, Any]:
        """The dict for ``cluster``, made if it is new, updated with ``values``."""
        state = self._by.get(cluster)
        if state is None:
            state = self._by[cluster] = {}
        state.update(values)
        return state

    def get(self, cluster: Any) -> dict[str, Any] | None:
        return self._by.get(cluster)

    def forget(self, cluster: Any) -> dict[str, Any] | None:
        return self._by.pop(cluster, None)

    def __contains__(self, cluster: Any) -> bool:
        return cluster in self._by

    def clusters(self) -> list[Any]:
        return list(self._by.keys())


class PlacedOperation:
    """Base of every operation that keeps state on clusters (see the module doc).

    Works for plain classes and for (frozen) dataclasses alike: the state lives in the instance's
    ``__dict__`` under a private name, made on first use, and is left out of copies and pickles."""

    @property
    def _placement(self) -> ClusterState:
        state = self.__dict__.get(_ATTR)
        if state is None:
            state = self.__dict__[_ATTR] = ClusterState()  # __dict__, so frozen dataclasses work too
        return state

    def hold(self, cluster: Any, **values: Any) -> dict[str, Any]:
        """Record that this operation holds state on ``cluster``; returns its dict, updated by ``values``."""
        return self._placement.hold(cluster, **values)

    def state_for(self, cluster: Any) -> dict[str, Any] | None:
        """What this operation keeps for ``cluster`` (a dict it may change), or ``None`` if nothing."""
        return self._placement.get(cluster)

    def is_placed_on(self, cluster: Any) -> bool:
        """Whether this operation holds state on ``cluster``."""
        return cluster in self._placement

    def forget(self, cluster: Any) -> dict[str, Any] | None:
        """Drop the record of ``cluster`` and return it (its devices keep what they hold: the next
        run there places the state again)."""
        return self._placement.forget(cluster)

    def placed_clusters(self) -> list[Any]:
        """The live clusters this operation holds state on."""
        return self._placement.clusters()

    # -- a copy is an operation of its own ----------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return without_cluster_state(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def without_cluster_state(state: dict[str, Any]) -> dict[str, Any]:
    """An instance ``__dict__`` without the cluster bookkeeping (for classes that copy themselves)."""
    return {k: v for k, v in state.items() if k != _ATTR}
