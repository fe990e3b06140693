"""The seeds' public names keep working, imported from where a user imports them.

``VirtualDevice``, ``VirtualChannel``, ``VirtualCluster``, ``Mesh`` and ``MeshIndex`` come from the
package root; the operations, specs, pipeline, tensor-parallel and timeline names from their
packages.  Each is exercised once, its result checked against numpy or a single-process reference.
"""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar import Mesh, MeshIndex, VirtualChannel, VirtualCluster, VirtualDevice, nn
from virtualpar.ops import Operation, ShardedOperation
from virtualpar.pipeline import PipelinedOperation, Pipeline, PipelineStage
from virtualpar.sharding import DimSharding, TensorSharding
from virtualpar.tensor_parallel import FeedForward, FeedForwardShardingPolicy, MatMul, MatMulShardingPolicy
from virtualpar.timeline import SequencePipe, TimelineParallel, reference_step

MESH = Mesh({"x": 2, "y": 2})
RNG = np.random.default_rng(8)


@pytest.fixture(scope="module")
def cluster():
    with VirtualCluster(MESH) as c:
        yield c


def _identity(dev):
    return isinstance(dev, VirtualDevice), dev.rank, tuple(dev.index)


def test_mesh_and_mesh_index():
    assert MESH.size == 4 and tuple(MESH.axis_names) == ("x", "y")
    idx = MeshIndex(("x", "y"), (1, 0))
    assert (idx.x, idx["y"], tuple(idx), str(idx)) == (1, 0, (1, 0), "(x=1, y=0)")


def test_every_device_is_a_virtual_device_at_its_mesh_coordinates(cluster):
    want = [(True, 0, (0, 0)), (True, 1, (0, 1)), (True, 2, (1, 0)), (True, 3, (1, 1))]
    assert cluster.run(_identity) == want


def test_a_virtual_channel_is_an_empty_ring_between_two_endpoints():
    from virtualpar.transport.shm import Layout, SharedArena

    layout = Layout(2, 4096)
    arena = SharedArena.create(layout.total_bytes)
    try:
        arena.unlink()
        ch = VirtualChannel(arena, layout, 0, 1)
        assert (ch.src, ch.dst, ch.readable(), ch.writable()) == (0, 1, 0, ch.capacity) and ch.capacity > 0
        assert repr(ch) == f"VirtualChannel(0->1, {ch.capacity} bytes)"
        del ch
    finally:
        arena.close()


def test_dim_and_tensor_sharding_print_and_parse_back():
    dim = DimSharding(("x", "y"))
    assert str(dim) == "S(x,y)" and DimSharding.parse(str(dim)) == dim
    spec = TensorSharding((DimSharding(("x",)), DimSharding()))
    assert TensorSharding.parse(str(spec)) == spec and spec == TensorSharding.of("x", None)


def test_an_operation_and_a_sharded_operation_match_numpy(cluster):
    double = Operation("double", lambda a: 2 * a, lambda shape: float(np.prod(shape)))
    rows = ShardedOperation(lambda dev, a: double(dev, a), [TensorSharding.of(("x", "y"), None)],
                            [TensorSharding.of(("x", "y"), None)], name="double_rows")
    a = RNG.standard_normal((8, 3))
    np.testing.assert_array_equal(cluster.execute(rows, a), 2 * a)


@pytest.mark.parametrize("policy", ["matched_inner", MatMulShardingPolicy.named("column", MESH)])
def test_matmul_executes_on_the_cluster_like_numpy(cluster, policy):
    a, b = RNG.standard_normal((8, 8)), RNG.standard_normal((8, 4))
    np.testing.assert_allclose(cluster.execute(MatMul(policy), a, b), a @ b, rtol=1e-12, atol=1e-12)


def test_a_feed_forward_policy_executes_on_the_cluster_like_numpy(cluster):
    x = RNG.standard_normal((2, 4, 8))
    w1, b1, w2, b2 = (RNG.standard_normal((8, 8)), RNG.standard_normal(8), RNG.standard_normal((8, 8)),
                      RNG.standard_normal(8))
    want = np.maximum(x @ w1 + b1, 0) @ w2 + b2
    op = FeedForward(FeedForwardShardingPolicy.named("megatron", MESH))
    np.testing.assert_allclose(cluster.execute(op, x, w1, b1, w2, b2), want, rtol=1e-12, atol=1e-12)


def _mlp() -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(4, 4, seed=i, dtype=np.float64) for i in range(4)])


def test_a_pipeline_of_stages_trains_like_one_process():
    x, y = RNG.standard_normal((8, 4)), RNG.standard_normal((8, 4))
    want, _ = nn.reference_train(_mlp(), [(x, y)], nn.mse_loss, nn.SGD(0.1), 2, 2)
    pipe = Pipeline(_mlp(), cuts=[2])
    assert [type(s) for s in pipe.stages] == [PipelineStage, PipelineStage]
    assert [s.first_layer for s in pipe.stages] == [0, 2]
    op = PipelinedOperation(pipe, "1f1b", microbatches=2, optimizer=nn.SGD(0.1))
    with VirtualCluster(2) as two:
        got = [two.execute(op, x, y) for _ in range(2)]
    np.testing.assert_allclose(got, want, rtol=1e-12)


class _LinearRNN(SequencePipe):
    """h ← tanh(x·Wx + h·Wh) over time; the loss reads the state after the last step."""

    def __init__(self) -> None:
        self.wx = nn.Linear(3, 3, seed=1, dtype=np.float64)
        self.wh = nn.Linear(3, 3, seed=2, bias=False, dtype=np.float64)

    def forward(self, inputs, states):
        (x,), (h,) = inputs, states
        for t in range(x.shape[1]):
            h = nn.tanh(self.wx(x[:, t]) + self.wh(h))
        return (h,), (h,)  # the output: the state after the segment's last step

    def loss_fn(self, outputs, labels):
        return nn.mse_loss(outputs[0], labels[0])

    def get_init_states(self):
        return (np.zeros(3),)

    def get_group(self):
        return "time"


def test_a_sequence_pipe_split_over_time_has_the_whole_sequence_loss():
    inputs, labels = (RNG.standard_normal((2, 4, 3)),), (RNG.standard_normal((2, 3)),)
    want, _ = reference_step(_LinearRNN(), inputs, labels, microbatches=1)
    op = TimelineParallel(_LinearRNN(), microbatches=1, optimizer=nn.SGD(0.1))
    with VirtualCluster(Mesh({"time": 2})) as two:
        got = two.execute(op, inputs, labels)
    assert got == pytest.approx(want, rel=1e-12)
