"""The policy explorer: every assignment of a 2x2 mesh's axes to A's and B's dims, its derived
program run forward and backward against numpy, its derived costs equal to what the run did."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from virtualpar import Mesh, VirtualCluster
from virtualpar.errors import ShardingError
from virtualpar.sim.hardware import get_hardware
from virtualpar.tensor_parallel.explore import assignments, choose, derive, explore
from virtualpar.tensor_parallel.runner import run_backward, run_forward

from ._tp_check import assert_phase_matches

M, K, N = 8, 12, 16
HW = get_hardware("h100-node")


@pytest.fixture(scope="module")
def cluster():
    with VirtualCluster(Mesh({"x": 2, "y": 2})) as c:
        yield c


def test_every_assignment_is_enumerated():
    pairs = assignments(Mesh({"x": 2, "y": 2}))
    assert len(pairs) == 81 and len(set(pairs)) == 81
    assert (((), ("x", "y")), (("x", "y"), ())) in pairs  # matched_inner over both axes


@pytest.mark.parametrize("replicate_output", [False, True], ids=["as-derived", "replicated"])
def test_every_candidate_runs_right_and_costs_what_it_says(cluster, replicate_output):
    mesh = cluster.mesh
    rng = np.random.default_rng(5)
    a, b, dc = rng.standard_normal((M, K)), rng.standard_normal((K, N)), rng.standard_normal((M, N))
    cands = explore(M, K, N, mesh, HW, "float64", replicate_output)
    assert len(cands) == 81  # every dim divides by 2 and by 4
    for cand in cands:
        layer = cand.layer
        assert not replicate_output or layer.c == ((), ())
        c, _, fwd = run_forward(cluster, layer, [a, b], (M, N))
        (da, db), _, bwd = run_backward(cluster, layer, dc, [(M, K), (K, N)])
        for label, got, want in (("C", c, a @ b), ("dA", da, dc @ b.T), ("dB", db, a.T @ dc)):
            rel = float(np.abs(got - want).max() / np.abs(want).max())
            assert rel <= 1e-12, f"{layer.name}: {label} relative error {rel:.3g}"
        assert_phase_matches(fwd, cand.cost.forward, mesh, f"{layer.name} forward")
        assert_phase_matches(bwd, cand.cost.backward, mesh, f"{layer.name} backward")


def test_derived_programs_reproduce_the_named_policies_collectives():
    matched = derive(((), ("x",)), (("x",), ()))
    assert [(s.op, s.axis) for s in matched.steps] == [("matmul", ""), ("g", "x")]
    column = derive(((), ()), ((), ("x",)))
    assert [(s.op, s.tensor, s.axis) for s in column.steps] == [("f", "A", "x"), ("matmul", "C", "")]
    full = derive((("x",), ("y",)), (("y",), ("x",)))  # B's n gathered over x (varying), partial over y
    assert [(s.op, s.tensor, s.axis) for s in full.steps] == [("all_gather", "B", "x"), ("matmul", "C", ""),
                                                              ("g", "C", "y")]


def test_ranking_and_auto_respects_memory():
    mesh = Mesh({"x": 2, "y": 4})
    cands = explore(4096, 2048, 4096, mesh, HW, "float32", replicate_output=True)
    times = [c.modelled_forward_s for c in cands]
    assert times == sorted(times)
    best = choose(4096, 2048, 4096, mesh, HW, replicate_output=True)
    assert best is next(c for c in cands if c.fits) or best == cands[0]
    # a device too small for the fastest candidate: auto takes the fastest that fits
    cap = sorted(c.peak_bytes for c in cands)[len(cands) // 2]
    small = dataclasses.replace(HW, device=dataclasses.replace(HW.device, memory_capacity=float(cap)))
    pick = choose(4096, 2048, 4096, mesh, small, replicate_output=True)
    assert pick.peak_bytes <= cap
    assert pick == next(c for c in explore(4096, 2048, 4096, mesh, small, "float32",
                                           True) if c.peak_bytes <= cap)
    tiny = dataclasses.replace(HW, device=dataclasses.replace(HW.device, memory_capacity=1.0))
    with pytest.raises(ShardingError, match="fits"):
        choose(4096, 2048, 4096, mesh, tiny)


ALLOWANCE = 16 << 10  # Python objects and message bookkeeping: not arrays, not modelled


def test_measured_peak_never_exceeds_the_modelled_peak(cluster):
    from virtualpar.tensor_parallel.execute import TensorParallelOp

    m, k, n = 128, 256, 192  # blocks of 16-190 KiB: the model, not the fixed allocations, decides
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    cands = explore(m, k, n, cluster.mesh, HW, "float64")
    warm = TensorParallelOp(cands[0].layer, ((m, k), (k, n)), (m, n))
    cluster.execute(warm, a, b)  # first-call imports on the devices are not the program's memory
    for cand in cands:
        op = TensorParallelOp(cand.layer, ((m, k), (k, n)), (m, n))
        want = a @ b
        assert np.abs(cluster.execute(op, a, b) - want).max() <= 1e-12 * np.abs(want).max(), cand.layer.name
        measured = max(op.peak_bytes(cluster))
        assert (
            measured <= cand.peak_bytes + ALLOWANCE
        ), f"{cand.layer.name}: measured {measured} B > modelled {cand.peak_bytes} B"
