"""Costs declared once: every FLOP count and α–β time is read from its one definition."""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar import kernels, nn
from virtualpar.pipeline.device_step import declared_flops
from virtualpar.pipeline.partition import Pipeline, action_flops
from virtualpar.sim import analytic


def test_matmul_flops_and_its_backward_are_the_closed_forms():
    assert kernels.matmul_flops(3, 5, 7) == 2 * 3 * 5 * 7 and isinstance(kernels.matmul_flops(3, 5, 7), int)
    assert kernels.matmul_flops(3, 5, 7, count=4) == 4 * 2 * 3 * 5 * 7
    assert kernels.matmul_backward_flops(3, 5, 7) == (2 * 3 * 7 * 5, 2 * 5 * 3 * 7)
    assert kernels.matmul_cost((4, 3, 5), (5, 7), 8) == (4 * 2 * 3 * 5 * 7, 8 * (4 * 15 + 35 + 4 * 21))


def test_a_linear_declares_its_forward_and_both_backward_parts():
    layer = nn.Linear(6, 10, seed=0)
    assert layer.flops(4) == 2 * 4 * 6 * 10
    assert layer.backward_flops(4) == (2 * 4 * 10 * 6, 2 * 6 * 4 * 10)


def test_a_stage_sums_what_its_layers_declare_per_action_kind():
    model = nn.Sequential(nn.Linear(4, 8, seed=0), nn.ReLU(), nn.LayerNorm(8), nn.Linear(8, 3, seed=1))
    got = action_flops(model, 5)
    linear = 2 * 5 * (4 * 8 + 8 * 3)
    norm = 2 * 5 * 16  # LayerNorm's 8 + 8 parameters, one multiply-add per row in each pass
    assert got == {"F": linear + norm, "I": linear + norm, "W": linear + norm, "B": 2 * (linear + norm)}
    stage = Pipeline(model, cuts=[2]).stages[1]
    assert stage.action_flops(1)["F"] == stage.flops(1) == 2 * (8 * 3) + 2 * 16


def test_the_executor_charges_the_declared_kind_and_backward_is_input_plus_weight():
    declared = {"F": 1.0, "I": 3.0, "W": 5.0}
    assert [declared_flops(declared, k) for k in "FIWB"] == [1.0, 3.0, 5.0, 8.0]
    assert declared_flops(2.5, "B") == 5.0 and declared_flops(2.5, "W") == 2.5  # forward only: a matmul's


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_ring_time_from_bytes_sent_is_the_ring_closed_form(n):
    M, a, b = 3.0e6, 2e-6, 4e10
    sent_ar = 2 * (n - 1) / n * M
    sent = (n - 1) / n * M
    assert analytic.ring_time("all_reduce", n, sent_ar, a, b) == pytest.approx(
        analytic.ring_all_reduce(n, M, a, b)
    )
    assert analytic.ring_time("all_gather", n, sent, a, b) == pytest.approx(
        analytic.ring_all_gather(n, M, a, b)
    )
    assert analytic.ring_time("reduce_scatter", n, sent, a, b) == pytest.approx(
        analytic.ring_reduce_scatter(n, M, a, b))
    with pytest.raises(ValueError, match="unknown collective 'broadcast'"):
        analytic.ring_time("broadcast", n, sent, a, b)


def test_the_policy_estimate_reads_the_ring_time():
    from virtualpar.mesh import Mesh
    from virtualpar.sim import get_hardware
    from virtualpar.tensor_parallel import MatMulShardingPolicy
    from virtualpar.tensor_parallel.costs import modelled_estimate

    mesh, hw = Mesh({"x": 2, "y": 2}), get_hardware("h100-node")
    policy = MatMulShardingPolicy.named("row", mesh)
    cost = policy.cost(64, 32, 48, mesh, 8)
    (c,) = cost.forward.collectives
    q = mesh.size if len(c.axes) == 2 else 2  # the devices k is split over: the all_reduce's group
    want = kernels.matmul_flops(64, 32, 48) // q / hw.device.peak("float64") + analytic.ring_time(
        "all_reduce", q, c.bytes_sent, hw.intra_latency, hw.intra_bandwidth)
    assert modelled_estimate(cost.forward, mesh, hw, np.float64) == pytest.approx(want, rel=1e-12)


class _SkewedLinear(nn.Linear):
    """A layer that declares a backward unlike a matmul's: input part 1×, weight part 3× the forward."""

    def backward_flops(self, rows: int) -> tuple[float, float]:
        return self.flops(rows), 3 * self.flops(rows)


def test_an_executed_split_backward_is_charged_what_the_layers_declare():
    """zb_h1 splits every backward into I and W: each is charged its declared part (not a constant
    2 × forward, which the executor used to hard-code), and a full B would be their sum."""
    from virtualpar import VirtualCluster
    from virtualpar.pipeline import PipelinedOperation
    from virtualpar.sim import Hardware
    from virtualpar.sim.hardware import DeviceSpec

    inf = float("inf")
    device = DeviceSpec("flop", {"float32": 1.0, "float64": 1.0}, inf, inf)
    hw = Hardware.uniform(latency=0.0, bandwidth=inf, device=device)
    model = nn.Sequential(_SkewedLinear(8, 8, seed=0, dtype=np.float64), nn.ReLU(),
                          _SkewedLinear(8, 8, seed=1, dtype=np.float64))
    op = PipelinedOperation(Pipeline(model, cuts=[2]), "zb_h1", microbatches=2)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 8)), rng.standard_normal((4, 8))
    with VirtualCluster(2, hardware=hw) as cluster:
        cluster.execute(op, x, y)
    forward = 2 * 2 * 8 * 8  # 2 rows per microbatch through one 8x8 layer
    for rank, records in op.last_records.items():
        took = {a.kind: m1 - m0 for a, _, _, m0, m1 in records if a.microbatch == 0}
        assert took["F"] == pytest.approx(forward), rank
        assert took["I"] == pytest.approx(forward) and took["W"] == pytest.approx(3 * forward), rank
