"""``cluster.execute``'s one protocol: an object with ``execute_on``, or one its layer registered an
adapter for (no process needed; the cluster's ``execute`` is
``as_executable(op).execute_on(cluster, ...)``)."""

from __future__ import annotations

import networkx as nx
import pytest

from virtualpar import UsageError, executable
from virtualpar.executable import Executable, as_executable, register_executable
from virtualpar.ops import GraphOperation


class _Echo:
    def execute_on(self, cluster, *args, **kwargs):
        return cluster, args, kwargs


class _Recipe:
    """Stands for something that is not an operation but describes one."""


class _SpicyRecipe(_Recipe):
    pass


def test_an_operation_runs_itself_and_a_graph_is_adapted_by_its_layer():
    echo = _Echo()
    assert as_executable(echo) is echo and isinstance(echo, Executable)
    assert as_executable(echo).execute_on("cluster", 1, k=2) == ("cluster", (1,), {"k": 2})
    graph = nx.DiGraph()
    assert isinstance(as_executable(graph), GraphOperation) and as_executable(graph).graph is graph


def test_a_registered_adapter_serves_its_type_and_subclasses_and_the_rest_is_refused():
    with pytest.raises(UsageError, match="cluster.execute needs an operation .* got _Recipe"):
        as_executable(_Recipe())
    register_executable(_Recipe, lambda r: _Echo())
    try:
        assert isinstance(as_executable(_SpicyRecipe()), _Echo)
    finally:
        del executable._ADAPTERS[_Recipe]
    with pytest.raises(UsageError, match=r"got int \(adapted kinds: networkx.DiGraph\)"):
        as_executable(3)


def test_the_cluster_dispatches_through_the_protocol_alone():
    """runtime/cluster.py names no operation class and imports no layer above it (see test_layering)."""
    import inspect

    from virtualpar.runtime.cluster import VirtualCluster

    source = inspect.getsource(VirtualCluster.execute)
    assert "as_executable(op).execute_on(self, *args, **kwargs)" in source
    assert "import" not in source and "isinstance" not in source
