"""``MatMul`` and ``FeedForward`` are operations: ``cluster.execute(MatMul(policy), a, b)`` for every
policy, shapes taken from the inputs, with or without resident weights; results against numpy."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from virtualpar import Mesh, ShardingError, UsageError, VirtualCluster
from virtualpar.sharding import shard
from virtualpar.tensor_parallel import (FFN_POLICIES, MATMUL_POLICIES, FeedForward, FeedForwardShardingPolicy,
                                        MatMul, MatMulShardingPolicy)

MESH = Mesh({"x": 2, "y": 2})
RNG = np.random.default_rng(39)
A, B, B2 = RNG.standard_normal((8, 8)), RNG.standard_normal((8, 4)), RNG.standard_normal((8, 4))
X = RNG.standard_normal((2, 4, 8))
W = (RNG.standard_normal((8, 8)), RNG.standard_normal(8), RNG.standard_normal((8, 8)), RNG.standard_normal(8))


def _ffn(x, w1, b1, w2, b2):
    return np.maximum(x @ w1 + b1, 0) @ w2 + b2


@pytest.fixture(scope="module")
def cluster():
    with VirtualCluster(MESH) as c:
        yield c


@pytest.mark.parametrize("name", sorted(MATMUL_POLICIES))
def test_every_matmul_policy_runs_as_an_operation_with_shapes_from_its_inputs(cluster, name):
    for op in (MatMul(name), MatMul(MatMulShardingPolicy.named(name, MESH))):
        np.testing.assert_allclose(cluster.execute(op, A, B), A @ B, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(cluster.execute(op, A[:4], B), A[:4] @ B, rtol=1e-12, atol=1e-12)  # m=4


@pytest.mark.parametrize("name", sorted(MATMUL_POLICIES))
def test_every_matmul_policy_keeps_b_resident(cluster, name):
    op = MatMul(name)
    assert op.resident(cluster) == ()
    sent = op.place(cluster, b=B)
    assert op.resident(cluster) == ("b",) and sent >= B.nbytes  # every device got its piece of B
    cluster.reset_stats()
    np.testing.assert_allclose(cluster.execute(op, A), A @ B, rtol=1e-12, atol=1e-12)
    a_pieces = shard(A, op.bind(MESH).input_layouts()[0], MESH)
    assert cluster.stats().host_to_device.sum() == sum(p.nbytes for p in a_pieces)  # B was not sent again
    np.testing.assert_allclose(cluster.execute(op, A, B2), A @ B2, rtol=1e-12, atol=1e-12)  # all inputs
    np.testing.assert_allclose(cluster.execute(op, A), A @ B, rtol=1e-12, atol=1e-12)  # ...left B in place
    twin = copy.copy(op)
    assert twin.resident(cluster) == ()  # a copy is an operation of its own
    with pytest.raises(ShardingError, match=r"expected 2 inputs \(a, b\) or all 2 \(a, b\), got 1"):
        cluster.execute(twin, A)


@pytest.mark.parametrize("name", sorted(FFN_POLICIES))
def test_every_feedforward_policy_runs_as_an_operation_with_and_without_resident_weights(cluster, name):
    want = _ffn(X, *W)
    for op in (FeedForward(name), FeedForward(FeedForwardShardingPolicy.named(name, MESH))):
        np.testing.assert_allclose(cluster.execute(op, X, *W), want, rtol=1e-12, atol=1e-12)
    op = FeedForward(name)
    op.place(cluster, w1=W[0], b1=W[1], w2=W[2], b2=W[3])
    assert op.resident(cluster) == ("w1", "b1", "w2", "b2")
    np.testing.assert_allclose(cluster.execute(op, X), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cluster.execute(op, 2 * X), _ffn(2 * X, *W), rtol=1e-12, atol=1e-12)


def test_mistakes_are_named(cluster):
    with pytest.raises(ShardingError, match=r"MatMul of A \(8, 8\) @ B \(4, 8\): .*inner dimensions 8 and 4"):
        cluster.execute(MatMul("column"), A, B.T)
    with pytest.raises(ShardingError, match=r"cannot shard dim 1 of input 1 of column \(execute\), shape"):
        cluster.execute(MatMul("column"), A, B[:, :3])
    with pytest.raises(ShardingError, match="unknown MatMul policy 'diagonal'"):
        cluster.execute(MatMul("diagonal"), A, B)
    with pytest.raises(ShardingError, match=r"place: takes inputs by name, some of \['a', 'b'\]; got"):
        MatMul("column").place(cluster, w=B)
    with pytest.raises(ShardingError, match=r"MatMul\('column'\) takes its mesh axes from a mesh: .*bind"):
        MatMul("column").input_layouts()
    assert str(MatMul("column").bind(MESH).output_layout()) == "[R, S(x,y)]"
    with pytest.raises(ShardingError, match=r"FeedForward of x \(2, 4, 8\), W1 \(8, 8\), b1 \(4,\)"):
        cluster.execute(FeedForward("megatron"), X, W[0], W[1][:4], W[2], W[3])
    with pytest.raises(UsageError, match="cluster.execute needs an operation .* got str"):
        cluster.execute("matched_inner", A, B)
