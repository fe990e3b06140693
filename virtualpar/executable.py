"""The one protocol by which ``cluster.execute`` runs an operation.

An *executable* is any object with ``execute_on(cluster, *args, **kwargs)``: it drives the cluster
through the cluster's public API (``run``, ``put``, ``get``, ``mesh``), exactly as a user's script
would, and returns what the host should see.  ``VirtualCluster.execute(op, *args)`` calls
``as_executable(op).execute_on(cluster, *args)`` and knows nothing else of operations: sharded
operations, tensor-parallel layers, pipelines and strategies all live above the runtime and
depend on it only through this protocol (the runtime imports none of them).

A kind of object that is not an operation itself but stands for one — a ``networkx.DiGraph`` of
sharded operations — is turned into one by an *adapter* its own layer registers
(``register_executable(nx.DiGraph, GraphOperation)`` in ``virtualpar.ops``): a lookup table, so the
runtime needs no import of the layers above it.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

from .errors import UsageError

__all__ = ["Executable", "register_executable", "as_executable"]


@runtime_checkable
class Executable(Protocol):
    """Runs itself on a cluster: host inputs in, host outputs back."""

    def execute_on(self, cluster: Any, *args: Any, **kwargs: Any) -> Any: ...


_ADAPTERS: dict[type, Callable[[Any], Executable]] = {}


def register_executable(kind: type, adapter: Callable[[Any], Executable]) -> None:
    """Make ``cluster.execute(obj)`` run ``adapter(obj)`` for objects of type ``kind`` or a subclass."""
    _ADAPTERS[kind] = adapter


def as_executable(obj: Any) -> Executable:
    """``obj`` itself if it has ``execute_on``, else the registered adapter of its type (most
    derived first); anything else is a ``UsageError`` naming what was given."""
    if callable(getattr(obj, "execute_on", None)):
        return obj
    for kind in type(obj).__mro__:
        adapter = _ADAPTERS.get(kind)
        if adapter is not None:
            return adapter(obj)
    known = ", ".join(k.__module__.split(".")[0] + "." + k.__name__ for k in _ADAPTERS)
    raise UsageError(f"cluster.execute needs an operation (with execute_on) or a networkx.DiGraph of them, "
                     f"got {type(obj).__name__}" + (f" (adapted kinds: {known})" if known else ""))
