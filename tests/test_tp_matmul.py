"""MatMul policies: forward and backward against numpy, and every closed form against a real run."""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar import Mesh, VirtualCluster
from virtualpar.errors import ShardingError
from virtualpar.tensor_parallel import MATMUL_POLICIES, MatMul, MatMulShardingPolicy, infer_matmul_policy
from virtualpar.tensor_parallel.layout import format_layout, parse_layout
from virtualpar.tensor_parallel.runner import run_backward, run_forward

from ._tp_check import assert_phase_matches

M, K, N = 24, 48, 36  # divisible by every axis product below (2, 3, 6)
F32_BOUND = 2e-6      # float32: max |error| / max |reference| over the output or gradient


@pytest.fixture(scope="module", params=[(2, 2), (2, 3)], ids=["x2y2", "x2y3"])
def cluster(request):
    x, y = request.param
    with VirtualCluster(Mesh({"x": x, "y": y})) as c:
        yield c


def _rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(MATMUL_POLICIES))
def test_policy_matches_numpy_and_its_closed_forms(cluster, name, dtype):
    mesh = cluster.mesh
    rng = np.random.default_rng(7)
    a, b, dc = (rng.standard_normal(s).astype(dtype) for s in ((M, K), (K, N), (M, N)))
    policy = MatMulShardingPolicy.named(name, mesh)
    policy.check(M, K, N, mesh)
    layer = MatMul(policy)
    c, _, fwd = run_forward(cluster, layer, [a, b], (M, N))
    (da, db), _, bwd = run_backward(cluster, layer, dc, [(M, K), (K, N)])
    a64, b64, dc64 = (v.astype(np.float64) for v in (a, b, dc))
    bound = 1e-12 if dtype == np.float64 else F32_BOUND
    for label, got, want in (("C", c, a64 @ b64), ("dA", da, dc64 @ b64.T), ("dB", db, a64.T @ dc64)):
        assert got.dtype == dtype
        assert _rel(got, want) <= bound, f"{policy}: {label} relative error {_rel(got, want):.3g} > {bound}"
    cost = policy.cost(M, K, N, mesh, np.dtype(dtype).itemsize)
    assert_phase_matches(fwd, cost.forward, mesh, f"{policy} forward")
    assert_phase_matches(bwd, cost.backward, mesh, f"{policy} backward")


def test_matched_inner_moves_the_ring_all_reduce_bytes():
    """The issue's example: matched_inner over n devices sends 2(n−1)/n·|C| bytes per device."""
    mesh = Mesh({"x": 2, "y": 3})
    cost = MatMulShardingPolicy.named("matched_inner", mesh).cost(M, K, N, mesh, 8)
    assert cost.forward.bytes_sent == 2 * 5 * M * N * 8 // 6
    assert cost.backward.bytes_sent == 0


@pytest.mark.parametrize("name", sorted(MATMUL_POLICIES))
def test_inference_recovers_each_policy_from_its_input_layouts(name):
    policy = MatMulShardingPolicy.named(name, Mesh({"x": 2, "y": 2}))
    a, b, _ = policy.layouts()
    inferred = infer_matmul_policy(a, b)
    want = "matched_inner" if name == "row" else name  # row is matched_inner in Megatron's words
    assert inferred.name == want and inferred.layouts() == policy.layouts()


def test_layout_text_round_trips():
    for text in ("[R, R]", "[S(x), R]", "[R, S(x,y)]", "[S(y), S(x)]"):
        assert format_layout(parse_layout(text)) == text


def test_bad_specs_say_what_was_received_and_expected():
    mesh = Mesh({"x": 2, "y": 2})
    with pytest.raises(ShardingError, match=r"A\[R, S\(x\)\] @ B\[S\(x\), S\(y\)\].*expected one of"):
        infer_matmul_policy(parse_layout("[R, S(x)]"), parse_layout("[S(x), S(y)]"))
    with pytest.raises(ShardingError, match="mesh axis 'x' used twice"):
        MatMulShardingPolicy.named("outer", mesh, m="x", k="x").check(M, K, N, mesh)
    with pytest.raises(ShardingError,
                       match=r"dim 1 of A \(matched_inner\), shape \(6, 5\), over mesh axes \(.x., .y.\) "
                             r"\(size 4\): 5 is not divisible by 4"):
        MatMulShardingPolicy.named("matched_inner", mesh).check(6, 5, 4, mesh)
    with pytest.raises(ShardingError, match="both sharded over"):
        MatMulShardingPolicy.named("unmatched_inner", mesh, ka="x", kb="x")
    with pytest.raises(ShardingError, match=r"policy 'matched_inner' expects A\[R, S\(K\)\] B\[S\(K\), R\]; "
                       r"received A\[R, S\(x\)\] B\[S\(y\), R\], which is unmatched_inner"):
        MatMulShardingPolicy.for_layouts("[R, S(x)]", "[S(y), R]", "matched_inner")
    assert MatMulShardingPolicy.for_layouts("[R, S(x)]", "[S(y), R]",
                                            "unmatched_inner").role_axes == {"ka": ("x",), "kb": ("y",)}
    with pytest.raises(ShardingError, match="unknown MatMul policy 'diagonal'"):
        MatMulShardingPolicy.named("diagonal", mesh)


def test_shapes_the_layouts_do_not_divide_are_refused_before_anything_runs():
    """k = 6 over 4 devices would give ragged pieces: each device multiplied what it got and the
    result was silently wrong (4 instead of 6); every entry point now refuses it by name."""
    from virtualpar.tensor_parallel import FFN_POLICIES, FeedForward, FeedForwardShardingPolicy
    from virtualpar.tensor_parallel.execute import TensorParallelOp

    mesh = Mesh({"x": 2, "y": 2})
    m, k, n = 4, 6, 4
    layer = MatMul(MatMulShardingPolicy.named("matched_inner", mesh))
    message = (
        r"cannot shard dim 1 of input 0 of matched_inner \({}\), shape \(4, 6\), over mesh axes \('x', 'y'\) "
        r"\(size 4\): 6 is not divisible by 4"
    )
    with VirtualCluster(mesh) as cluster:
        op = TensorParallelOp(layer, ((m, k), (k, n)), (m, n), weights=(1,))
        with pytest.raises(ShardingError, match=message.format("place_weights")):
            op.place_weights(cluster, np.ones((k, n)))
        with pytest.raises(ShardingError, match=message.format("execute")):
            cluster.execute(op, np.ones((m, k)), np.ones((k, n)))
        with pytest.raises(ShardingError, match=message.format("run_forward")):
            run_forward(cluster, layer, [np.ones((m, k)), np.ones((k, n))], (m, n))
        for name in FFN_POLICIES:  # the FFN's sharded dims: 6 tokens or 6 features do not split 4 (or 2) ways
            ffn = FeedForward(FeedForwardShardingPolicy.named(name, mesh))
            shapes = ((1, 6, 6), (6, 6), (6,), (6, 6), (6,))
            if name == "unsharded":
                continue
            with pytest.raises(ShardingError, match=r"is not divisible by"):
                run_forward(cluster, ffn, [np.ones(s) for s in shapes], (1, 6, 6))
        assert cluster.run(lambda dev: dev.rank) == [0, 1, 2, 3]  # nothing was left half-done
