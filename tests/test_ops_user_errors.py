"""Operations and graphs of them as a user meets them off the happy path: every expected value is
numpy's, computed here; every refused graph is refused before anything runs, naming node and port."""

from __future__ import annotations

import copy
import dataclasses

import networkx as nx
import numpy as np
import pytest

from virtualpar import ShardingError, UsageError, VirtualCluster
from virtualpar.ops import MATMUL, ShardedOperation
from virtualpar.sharding import TensorSharding as TS, shard, unshard

R = TS.of(None)


@pytest.fixture(scope="module")
def cluster():
    with VirtualCluster(4) as c:
        yield c


def _times(k):
    return ShardedOperation(lambda d, x: x * k, [R], [R])


def test_an_unfed_port_is_refused_not_filled_from_an_earlier_run(cluster):
    """A failed graph left node a's input on the devices; a later graph whose a.0 nothing fed used it."""
    g = nx.DiGraph()
    g.add_node("a", op=_times(10))
    g.add_node("b", op=ShardedOperation(lambda d, x: x, [TS.of("world")], [TS.of("world")]))
    g.graph["inputs"] = [("a", 0), ("b", 0)]
    with pytest.raises(ShardingError, match=r"graph input \('b', 0\): .*3"):
        cluster.execute(g, np.ones(2), np.ones(3))
    g2 = nx.DiGraph()
    g2.add_node("a", op=_times(10))
    with pytest.raises(UsageError, match=r"port 0 of node 'a' is fed by nothing"):
        cluster.execute(g2)
    g2.graph["inputs"] = [("a", 0)]
    np.testing.assert_array_equal(cluster.execute(g2, np.full(2, 3.0)), np.full(2, 30.0))


@pytest.mark.parametrize("mistake, said", [
    ("twice", r"port 0 of node 'b' is fed twice: by host input \('b', 0\) and by the edge 'a' -> 'b'"),
    ("no_op", r"node 'c' needs an 'op' attribute"),
    ("unknown", r"host input \('zz', 0\) feeds node 'zz', which is not in the graph"),
    ("port", r"the edge 'a' -> 'b' feeds port 3 of node 'b', which has ports 0..0"),
    ("not_a_list", r"must be a list of \(node, port\) pairs"),
    ("multi", "not a MultiDiGraph"),
])
def test_graphs_wired_wrong_are_refused_before_anything_runs(cluster, mistake, said):
    """A host input for an edge-fed port vanished (the edge won); the others were raw KeyError,
    IndexError or a device's TypeError on None."""
    g = nx.MultiDiGraph() if mistake == "multi" else nx.DiGraph()
    g.add_node("a", op=_times(2))
    g.add_node("b", op=_times(3))
    g.add_edge("a", "b", port=3 if mistake == "port" else 0)
    g.graph["inputs"] = [("a", 0)]
    if mistake == "twice":
        g.graph["inputs"].append(("b", 0))
    elif mistake == "no_op":
        g.add_node("c")
    elif mistake == "unknown":
        g.graph["inputs"].append(("zz", 0))
    elif mistake == "not_a_list":
        g.graph["inputs"] = ("a", 0)
    with pytest.raises(UsageError, match=said):
        cluster.execute(g,
                        *([np.ones(2)] * len(g.graph["inputs"]) if mistake != "not_a_list" else [np.ones(2)]))


def test_sinks_come_back_in_the_order_they_were_added(cluster):
    g = nx.DiGraph()
    for name, k in (("src", 1), ("mid", 1), ("out_double", 2), ("out_plus", 1)):
        g.add_node(name, op=_times(k))
    g.add_edge("src", "mid")
    g.add_edge("mid", "out_double")
    g.add_edge("src", "out_plus")
    g.graph["inputs"] = [("src", 0)]
    doubled, same = cluster.execute(g, np.full(2, 5.0))  # topological order put out_plus first
    np.testing.assert_array_equal(doubled, np.full(2, 10.0))
    np.testing.assert_array_equal(same, np.full(2, 5.0))


def test_partial_max_min_and_avg_keep_their_meaning(cluster):
    """P(max) filled the other devices with the largest finite float, so -inf came back as -1.8e308;
    P(avg) came back as the sum (never divided) and went in as x/n."""
    x = np.array([-np.inf, 1.0, np.inf])
    for op, want in (("max", x), ("min", x)):
        got = cluster.execute(ShardedOperation(lambda d, v, op=op: d.all_reduce(v, op=op),
                                               [TS.of(None, partial=op)], [R]), x)
        np.testing.assert_array_equal(got, want)
    rank_times = ShardedOperation(lambda d, v: v * (d.rank + 1), [R], [TS.of(None, partial="avg")])
    np.testing.assert_allclose(cluster.execute(rank_times, np.ones(1)), [2.5])  # mean of 1, 2, 3, 4
    into = ShardedOperation(lambda d, v: d.all_reduce(v, op="avg"), [TS.of(None, partial="avg")], [R])
    np.testing.assert_allclose(cluster.execute(into, np.ones(3)), np.ones(3))  # was 0.25
    pieces = shard(np.array([True, False]), TS.of(None, partial="min"), cluster.mesh)
    assert np.array_equal(unshard(pieces, TS.of(None, partial="min"), cluster.mesh), [True, False])
    with pytest.raises(ShardingError, match=r"unknown pending reduction P\(mean\)"):
        TS.of(None, partial="mean")


def test_a_copy_of_an_operation_keeps_its_own_weights(cluster):
    """copy, deepcopy and dataclasses.replace shared the original's device key: placing a weight
    through the copy replaced the original's."""
    mm = ShardedOperation(lambda d, a, w: a @ w, [TS.of(None, None), TS.of(None, "world")],
                          [TS.of(None, "world")])
    mm.place(cluster, 1, np.eye(4))
    for make in (copy.copy, copy.deepcopy, lambda o: dataclasses.replace(o, name="v")):
        other = make(mm)
        assert other.key != mm.key
        other.place(cluster, 1, 2 * np.eye(4))
        np.testing.assert_array_equal(cluster.execute(mm, np.ones((1, 4))), np.ones((1, 4)))
        np.testing.assert_array_equal(cluster.execute(other, np.ones((1, 4))), np.full((1, 4), 2.0))


def test_a_batched_matmul_charges_every_batch_entry():
    """MATMUL charged 2·a[0]·a[1]·b[1]: for (8, 64, 128) @ (128, 256), 262,144 FLOPs, not 33,554,432."""
    assert MATMUL.flops((8, 64, 128), (128, 256)) == 2 * 8 * 64 * 128 * 256
    assert MATMUL.flops((64, 128), (128, 256)) == 2 * 64 * 128 * 256
