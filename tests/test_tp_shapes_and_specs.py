"""Tensor parallelism and sharded operations where the user's declarations and the devices'
results disagree: each is refused, naming what and where, never answered silently."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from virtualpar import Mesh, VirtualCluster, nn
from virtualpar.errors import DeviceError, ShardingError, UsageError
from virtualpar.ops import MATMUL, ShardedOperation
from virtualpar.sharding import TensorSharding, plan_redistribution, shard
from virtualpar.tensor_parallel import FeedForwardShardingPolicy, MatMul, MatMulShardingPolicy
from virtualpar.tensor_parallel import autodiff as ad
from virtualpar.tensor_parallel.execute import TensorParallelOp

T = TensorSharding.parse
MESH = Mesh({"x": 2, "y": 2})


def test_a_declared_output_shape_the_devices_did_not_compute_is_refused():
    """A (1, 8) @ (8, 4) declared as (3, 4): the one real row came back repeated three times."""
    mesh = Mesh({"x": 2})
    op = TensorParallelOp(MatMul(MatMulShardingPolicy.named("column", mesh)), ((1, 8), (8, 4)), (3, 4))
    with VirtualCluster(mesh) as cluster:
        with pytest.raises(ShardingError,
                           match=r"device 0 \(x=0\) holds a piece of shape \(1, 2\) where the declared "
                                                r"shape \(3, 4\) with layout \[R, S\(x\)\] needs \(3, 2\)"):
            cluster.execute(op, np.ones((1, 8)), np.ones((8, 4)))


def _gather_back(dev, sizes):
    import autograd.numpy as anp

    start = sum(sizes[:dev.rank])
    x = np.arange(start, start + sizes[dev.rank], dtype=float)
    w = np.arange(sum(sizes), dtype=float) + 10 * dev.rank  # a different weight per device: varying
    rec = nn.vjp(lambda params, x: anp.sum(ad.all_gather(x, dev, 0, "x") * w), x, params={})
    return rec.backward_input(np.float64(1.0)).tolist()


def test_all_gathers_backward_refuses_uneven_pieces_it_cannot_place():
    """Pieces [2, 3] got gradients of the array_split layout [3, 2]: another member's rows."""
    with VirtualCluster(Mesh({"x": 2})) as cluster:
        assert cluster.run(_gather_back, [3, 2]) == [[10.0, 12.0, 14.0], [16.0, 18.0]]  # d/dx_j = 2j + 10
        with pytest.raises(ShardingError, match="all_gather of pieces of uneven size along dim 0"):
            cluster.run(_gather_back, [2, 3])


def test_sharded_operation_outputs_are_checked_against_their_spec():
    with VirtualCluster(MESH) as cluster:
        differ = ShardedOperation(lambda dev, a: a * (dev.rank + 1), [T("[R]")], [T("[R]")], name="differ")
        with pytest.raises(ShardingError,
                           match=r"differ, output 0: devices 0 \(x=0, y=0\) and 1 \(x=0, y=1\) hold "
                                                r"different copies of block"):
            cluster.execute(differ, np.ones(4))  # the last device's copy was kept silently
        ragged = ShardedOperation(lambda dev, a: a[: dev.rank + 1], [T("[S(x), R]")], [T("[S(x), R]")],
                                  name="rag")
        with pytest.raises(ShardingError,
                           match=r"rag, output 0: device 0 .* piece of shape \(1, 2\) where spec"):
            cluster.execute(ragged, np.ones((8, 2)))
        none = ShardedOperation(lambda dev, a: None, [T("[S(x)]")], [T("[S(x)]")], name="none")
        with pytest.raises(UsageError, match="none: the program's output 0 is a NoneType, not an array"):
            cluster.execute(none, np.ones(4))
        two = ShardedOperation(lambda dev, a: (a, a), [T("[S(x)]")], [T("[S(x)]")], name="my_layer")
        # not its key 'op/3'
        with pytest.raises(UsageError, match="my_layer: the program returned 2 outputs"):
            cluster.execute(two, np.ones(4))
        mm = ShardedOperation(lambda dev, a, b: MATMUL(dev, a, b), [T("[R, R]"), T("[R, R]")], [T("[R, R]")],
                              name="mm")
        for bad in (5, -1, 1.0):
            with pytest.raises(UsageError, match=r"mm.place: index must be an input position 0..1"):
                mm.place(cluster, bad, np.ones((2, 2)))


def test_axes_of_one_dim_out_of_the_mesh_order_are_refused():
    """S(y,x) was placed exactly as S(x,y) while plans and policies compared the tuples as written."""
    x = np.arange(4.0).reshape(4, 1)
    with pytest.raises(ShardingError, match=r"lists the axes of dim 0 as \(y,x\).*write S\(x,y\)"):
        shard(x, T("[S(y,x), R]"), MESH)
    with pytest.raises(ShardingError, match=r"write S\(x,y\)"):
        plan_redistribution(T("[S(y,x), R]"), T("[S(x,y), R]"), (4, 4), MESH)
    assert [p.ravel().tolist() for p in shard(x, T("[S(x,y), R]"), MESH)] == [[0.0], [1.0], [2.0], [3.0]]


def test_policy_roles_of_the_wrong_kind_are_refused_where_given():
    with pytest.raises(ShardingError, match=r"role k= takes a mesh axis name or a tuple of them, got 3"):
        MatMulShardingPolicy.named("matched_inner", MESH, k=3)
    with pytest.raises(ShardingError, match=r"role 't' needs at least one mesh axis, got \(\)"):
        FeedForwardShardingPolicy.named("megatron", MESH, t=())  # printed as megatron, ran replicated


def _graph(*nodes, edges, inputs):
    g = nx.DiGraph()
    for name, op in nodes:
        g.add_node(name, op=op)
    for u, v in edges:
        g.add_edge(u, v, port=0)
    g.graph["inputs"] = inputs
    return g


def test_graph_errors_name_the_node_or_the_edge():
    p = ShardedOperation(lambda dev, a: a, [T("[S(x), R]")], [T("[S(x), R]")], name="p")
    flat = ShardedOperation(lambda dev, a: a, [T("[R]")], [T("[R]")], name="flat")
    unknown = ShardedOperation(lambda dev, a: a, [T("[S(z), R]")], [T("[R, R]")], name="unknown")
    uneven = ShardedOperation(lambda dev, a: a, [T("[R, S(x,y)]")], [T("[R, S(x,y)]")], name="uneven")
    col = ShardedOperation(lambda dev, x, w: MATMUL(dev, x, w), [T("[R, R]"), T("[R, S(x,y)]")],
                           [T("[R, S(x,y)]")])
    row = ShardedOperation(lambda dev, h, w: MATMUL(dev, h, w), [T("[R, S(x,y)]"), T("[S(x,y), R]")],
                           [T("[R, R] P(sum)")])
    with VirtualCluster(MESH) as cluster:
        with pytest.raises(UsageError, match=r"the edge 'p' -> 'c' \(port 0\) carries 2-d values"):
            cluster.execute(_graph(("p", p), ("c", flat), edges=[("p", "c")], inputs=[("p", 0)]),
                            np.ones((4, 6)))
        with pytest.raises(UsageError, match=r"node 'c', input 0 spec \[S\(z\), R\]: unknown mesh axis 'z'"):
            cluster.execute(_graph(("p", p), ("c", unknown), edges=[("p", "c")], inputs=[("p", 0)]),
                            np.ones((4, 6)))
        with pytest.raises(ShardingError, match=r"on the edge 'p' -> 'c' \(port 0\): cannot shard dim 1"):
            cluster.execute(_graph(("p", p), ("c", uneven), edges=[("p", "c")], inputs=[("p", 0)]),
                            np.ones((4, 6)))
        with pytest.raises(DeviceError, match=r"raised ValueError .*\(in graph node 'row'\)"):
            cluster.execute(_graph(("col", col), ("row", row), edges=[("col", "row")],
                                   inputs=[("col", 0), ("col", 1), ("row", 1)]),
                            np.ones((4, 8)), np.ones((8, 16)), np.ones((12, 4)))


def _scaled_by_rank(dev, a):
    return a * (dev.rank + 1)


def test_partial_copies_must_agree_and_numpy_scalars_are_outputs():
    with VirtualCluster(MESH) as cluster:
        partial = ShardedOperation(_scaled_by_rank, [T("[R]")], [T("[R] P(sum:x)")], name="scale")
        with pytest.raises(ShardingError, match="hold different copies of one partial value"):
            cluster.execute(partial, np.ones(2))  # the copies over y disagreed and one was kept
        total = ShardedOperation(lambda dev, a: np.sum(a), [T("[R]")], [T("[]")], name="total")
        assert cluster.execute(total, np.arange(6.0)) == 15.0  # np.sum's numpy scalar was refused


def _unknown_op(dev, a):
    return dev.all_reduce(a, op="mean")


def test_an_error_in_a_graph_node_keeps_the_users_frames():
    node = ShardedOperation(_unknown_op, [T("[R]")], [T("[R]")], name="scale")
    with VirtualCluster(2) as cluster:
        with pytest.raises(UsageError,
                           match=r"^device \d \(world=\d\): in graph node 'n': all_reduce") as info:
            cluster.execute(_graph(("n", node), edges=[], inputs=[("n", 0)]), np.ones(2))
    assert "_unknown_op" in str(info.value.__cause__)  # the remote traceback reaches the user's function


def test_a_backward_after_a_failed_forward_is_refused():
    """It went back through the forward before the failed one: dB was a1ᵀ dC for a forward of a2."""
    from virtualpar.tensor_parallel.runner import run_backward, run_forward

    rng = np.random.default_rng(0)
    a1, a2, b, dc = (rng.standard_normal(s) for s in ((8, 16), (8, 16), (16, 4), (8, 4)))
    layer = MatMul(MatMulShardingPolicy.named("matched_inner", MESH))
    with VirtualCluster(MESH) as cluster:
        run_forward(cluster, layer, [a1, b], (8, 4))
        cluster.inject(1, 1, "raise")
        with pytest.raises(Exception, match="injected fault"):
            run_forward(cluster, layer, [a2, b], (8, 4))
        with pytest.raises(UsageError, match="no forward to go back through"):
            run_backward(cluster, layer, dc, [(8, 16), (16, 4)])


def test_copies_of_operations_have_their_own_device_state():
    """A copy shared its original's key: placing weights through it overwrote the original's, and
    training a deepcopy of a pipeline trained the original's weights."""
    import copy
    import dataclasses

    from virtualpar.pipeline import Pipeline, PipelinedOperation
    from virtualpar.tensor_parallel.execute import TensorParallelOp

    mesh = Mesh({"x": 2})
    a, b1, b2 = np.arange(8.0).reshape(2, 4), np.ones((4, 4)), 2 * np.ones((4, 4))
    with VirtualCluster(mesh) as cluster:
        op1 = TensorParallelOp(MatMul(MatMulShardingPolicy.named("column", mesh)), ((2, 4), (4, 4)), (2, 4),
                               weights=(1,))
        op1.place_weights(cluster, b1)
        copy.copy(op1).place_weights(cluster, b2)
        np.testing.assert_allclose(cluster.execute(op1, a), a @ b1)
        with pytest.raises(ShardingError, match="expected 2 arrays"):  # placed nothing of its own
            cluster.execute(dataclasses.replace(op1), a)
        model = nn.Sequential(nn.Linear(4, 4, dtype=np.float64), nn.Linear(4, 4, seed=1, dtype=np.float64))
        op = PipelinedOperation(Pipeline(model, [1]), "1f1b", 2)
        x, y = np.ones((4, 4)), np.zeros((4, 4))
        cluster.execute(op, x, y)
        before = op.state_dict(cluster)
        twin = copy.deepcopy(op)
        cluster.execute(twin, x, y)
        assert twin.key != op.key
        assert all(np.array_equal(op.state_dict(cluster)[k], before[k]) for k in before)


def test_the_same_program_reports_the_same_peak_memory_whatever_ran_first():
    """The first policy measured reported |C| more on device 0: the previous output, still held,
    kept a receive buffer busy, so the measured call made another one."""
    from virtualpar.tensor_parallel.table import policy_rows

    with VirtualCluster(MESH) as cluster:
        rows = policy_rows(cluster, (256, 128, 256), names=("matched_inner", "row", "matched_inner"))
    peaks = [r.peak_bytes_per_device for r in rows]
    assert max(peaks) - min(peaks) < 0.05 * 256 * 256 * 4  # far below |C| = 256 KiB (float32)
