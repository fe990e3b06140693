"""FeedForward policies: y and every gradient against virtualpar.nn's single-process reference, and
each policy's collectives, bytes and FLOPs per device against its closed forms."""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar import Mesh, VirtualCluster, nn
from virtualpar.errors import ShardingError
from virtualpar.tensor_parallel.ffn import FFN_POLICIES, FeedForward, FeedForwardShardingPolicy
from virtualpar.tensor_parallel.runner import run_backward, run_forward

from ._tp_check import assert_phase_matches

B, S, M, H = 4, 12, 12, 24  # divisible by 2, 3, 4 and 6 where each policy needs it
F32_BOUND = 2e-6


def _reference(x, w1, b1, w2, b2, dy):
    """y and (dx, dW1, db1, dW2, db2) from virtualpar.nn's single-process Sequential(Linear, ReLU, Linear)."""
    model = nn.Sequential(nn.Linear(M, H, dtype=np.float64), nn.ReLU(), nn.Linear(H, M, dtype=np.float64))
    model.load_state_dict({"0.weight": w1, "0.bias": b1, "2.weight": w2, "2.bias": b2})
    rec = nn.vjp(model, x)
    dx, grads = rec.backward(dy)
    return rec.output, (dx, grads["0.weight"], grads["0.bias"], grads["2.weight"], grads["2.bias"])


@pytest.fixture(scope="module", params=[(2, 2), (2, 3)], ids=["x2y2", "x2y3"])
def cluster(request):
    x, y = request.param
    with VirtualCluster(Mesh({"x": x, "y": y})) as c:
        yield c


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(FFN_POLICIES))
def test_policy_matches_numpy_and_its_closed_forms(cluster, name, dtype):
    mesh = cluster.mesh
    rng = np.random.default_rng(3)
    shapes = ((B, S, M), (M, H), (H,), (H, M), (M,))
    inputs = [rng.standard_normal(s).astype(dtype) for s in shapes]
    dy = rng.standard_normal((B, S, M)).astype(dtype)
    policy = FeedForwardShardingPolicy.named(name, mesh)
    policy.check(B, S, M, H, mesh)
    layer = FeedForward(policy)
    y, _, fwd = run_forward(cluster, layer, inputs, (B, S, M))
    grads, _, bwd = run_backward(cluster, layer, dy, shapes)
    want_y, want_grads = _reference(*(v.astype(np.float64) for v in inputs), dy.astype(np.float64))
    bound = 1e-12 if dtype == np.float64 else F32_BOUND
    for label, got, want in zip(("y", "dx", "dW1", "db1", "dW2", "db2"), (y, *grads), (want_y, *want_grads)):
        rel = float(np.abs(got - want).max() / np.abs(want).max())
        assert got.dtype == dtype and rel <= bound, f"{policy}: {label} relative error {rel:.3g} > {bound}"
    cost = policy.cost(B, S, M, H, mesh, np.dtype(dtype).itemsize)
    assert_phase_matches(fwd, cost.forward, mesh, f"{policy} forward")
    assert_phase_matches(bwd, cost.backward, mesh, f"{policy} backward")


def test_megatron_is_one_all_reduce_each_way_and_sequence_parallel_swaps_it():
    mesh = Mesh({"t": 4})
    meg = FeedForwardShardingPolicy.named("megatron", mesh).cost(B, S, M, H, mesh, 4)
    sp = FeedForwardShardingPolicy.named("sequence_parallel", mesh).cost(B, S, M, H, mesh, 4)
    assert meg.forward.kinds() == {"all_reduce": 1} and meg.backward.kinds() == {"all_reduce": 1}
    assert sp.forward.kinds() == {"all_gather": 1, "reduce_scatter": 1}
    # an all_reduce is a reduce_scatter followed by an all_gather: same activation bytes on the wire
    assert sp.forward.bytes_sent == meg.forward.bytes_sent


def test_bad_ffn_specs():
    mesh = Mesh({"x": 2, "y": 2})
    with pytest.raises(ShardingError,
                       match=r"dim 1 of x \(sequence_parallel\), shape \(4, 6, 12\), over mesh axes \(.x., "
                             r".y.\) \(size 4\): 6 is not divisible by 4"):
        FeedForwardShardingPolicy.named("sequence_parallel", mesh).check(4, 6, 12, 24, mesh)
    with pytest.raises(ShardingError, match="mesh axis 'x' used twice"):
        FeedForwardShardingPolicy.named("gspmd", mesh, x="x", y="x").check(B, S, M, H, mesh)
    with pytest.raises(ShardingError, match="needs a mesh with at least 2 axes"):
        FeedForwardShardingPolicy.named("gspmd", Mesh({"t": 4}))
