"""The FeedForward explorer: every policy × role assignment on a 2x2 mesh runs right (fwd and bwd),
costs what its closed form says, and never allocates more than its modelled peak."""

from __future__ import annotations

import dataclasses

import autograd.numpy as anp
import numpy as np
import pytest
from autograd import make_vjp

from virtualpar import Mesh, VirtualCluster
from virtualpar.errors import ShardingError
from virtualpar.sim.hardware import get_hardware
from virtualpar.tensor_parallel.execute import TensorParallelOp
from virtualpar.tensor_parallel.explore_ffn import choose_ffn, explore_ffn
from virtualpar.tensor_parallel.ffn import FeedForward
from virtualpar.tensor_parallel.runner import run_backward, run_forward

from ._tp_check import assert_phase_matches

B, S, M, H = 4, 64, 128, 256  # large enough that fixed allocations (~30 KB) do not blur the peak check
HW = get_hardware("h100-node")
SHAPES = ((B, S, M), (M, H), (H,), (H, M), (M,))
ALLOWANCE = 16 << 10  # Python objects and message bookkeeping: not arrays, not modelled


@pytest.fixture(scope="module")
def cluster():
    with VirtualCluster(Mesh({"x": 2, "y": 2})) as c:
        yield c


def test_every_candidate(cluster):
    mesh = cluster.mesh
    cands = explore_ffn(B, S, M, H, mesh, HW, "float64")
    # unsharded; megatron and sequence_parallel over (x), (y), (x,y) — (y,x) is the same program, a
    # layout shards over its axes in mesh order —; gspmd with x, y on the axes (x, y) or (y, x)
    assert len(cands) == 9
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal(s) for s in SHAPES]
    dy = rng.standard_normal((B, S, M))
    vjp, want = make_vjp(lambda x, w1, b1, w2, b2: anp.maximum(x @ w1 + b1, 0) @ w2 + b2,
                         argnum=(0, 1, 2, 3, 4))(*inputs)
    want_grads = vjp(dy)
    # first-call imports
    cluster.execute(TensorParallelOp(FeedForward(cands[0].policy), SHAPES, (B, S, M)), *inputs)
    for cand in cands:
        layer = FeedForward(cand.policy)
        y, _, fwd = run_forward(cluster, layer, inputs, (B, S, M))
        grads, _, bwd = run_backward(cluster, layer, dy, SHAPES)
        for got, ref in zip((y, *grads), (want, *want_grads)):
            assert np.abs(got - ref).max() <= 1e-12 * np.abs(ref).max(), cand.policy
        assert_phase_matches(fwd, cand.cost.forward, mesh, f"{cand.policy} forward")
        assert_phase_matches(bwd, cand.cost.backward, mesh, f"{cand.policy} backward")
        op = TensorParallelOp(layer, SHAPES, (B, S, M))
        assert np.abs(cluster.execute(op, *inputs) - want).max() <= 1e-12 * np.abs(want).max(), cand.policy
        measured = max(op.peak_bytes(cluster))
        assert (
            measured <= cand.peak_bytes + ALLOWANCE
        ), f"{cand.policy}: measured peak {measured} B > modelled {cand.peak_bytes} B"


def test_auto_takes_the_fastest_that_fits():
    mesh = Mesh({"x": 2, "y": 4})
    cands = explore_ffn(8, 128, 1024, 4096, mesh, HW)
    assert [c.modelled_forward_s for c in cands] == sorted(c.modelled_forward_s for c in cands)
    assert choose_ffn(8, 128, 1024, 4096, mesh, HW) == cands[0]
    cap = min(c.peak_bytes for c in cands)
    small = dataclasses.replace(HW, device=dataclasses.replace(HW.device, memory_capacity=float(cap)))
    assert choose_ffn(8, 128, 1024, 4096, mesh, small).peak_bytes == cap
    tiny = dataclasses.replace(HW, device=dataclasses.replace(HW.device, memory_capacity=1.0))
    with pytest.raises(ShardingError, match="fits"):
        choose_ffn(8, 128, 1024, 4096, mesh, tiny)
