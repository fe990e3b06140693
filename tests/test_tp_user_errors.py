"""Tensor parallelism as a user meets it beyond the named policies' happy path: NaN outputs, uneven
pieces through the differentiable primitives, weights placed all or none, hardware given as
nothing or a name, JSON without NaN, the explorer's programs listed once, and errors that say
what to do.  Every expected value is numpy's, computed here."""

from __future__ import annotations

import json

import numpy as np
import pytest

from virtualpar import Mesh, VirtualCluster, nn
from virtualpar.cli import main
from virtualpar.errors import ShardingError, UsageError
from virtualpar.tensor_parallel import FeedForward, FeedForwardShardingPolicy, MatMul, MatMulShardingPolicy
from virtualpar.tensor_parallel import autodiff as ad
from virtualpar.tensor_parallel.execute import TensorParallelOp
from virtualpar.tensor_parallel.explore import choose
from virtualpar.tensor_parallel.explore_ffn import explore_ffn
from virtualpar.tensor_parallel.layout import format_layout, parse_layout
from virtualpar.tensor_parallel.runner import run_backward, run_forward
from virtualpar.tensor_parallel.table import policy_rows

MESH = Mesh({"x": 2, "y": 2})


@pytest.fixture(scope="module")
def cluster():
    with VirtualCluster(MESH, hardware="h100-node") as c:
        yield c


def test_a_nan_in_a_replicated_output_is_returned_not_called_a_wrong_program(cluster):
    """unshard compared the replicas with array_equal, for which NaN != NaN: 'replicas differ'."""
    a, b = np.ones((4, 4)), np.ones((4, 4))
    a[0, 0] = np.nan
    layer = MatMul(MatMulShardingPolicy.named("matched_inner", MESH))
    for c in (cluster.execute(TensorParallelOp(layer, ((4, 4), (4, 4)), (4, 4)), a, b),
              run_forward(cluster, layer, [a, b], (4, 4))[0]):
        np.testing.assert_array_equal(c, a @ b)  # row 0 NaN, the rest 4


def _gather_back(dev, sizes, w):
    bounds = np.cumsum([0, *sizes])
    x = np.arange(10.0).reshape(5, 2)[bounds[dev.rank]:bounds[dev.rank + 1]]
    rec = nn.vjp(lambda p, x: ad.all_gather_invariant(x, dev, 0, None), x, params={})
    return rec.backward_input(w)


def test_all_gather_invariant_gives_each_uneven_piece_its_own_gradient_or_refuses():
    """Pieces of 3 and 2 rows: member 0 got a (2, 2) gradient for its (3, 2) piece and member 1
    rows 2-3 of the cotangent (x.shape // n); the gradient of a piece is its own rows."""
    w = np.random.default_rng(0).standard_normal((5, 2))
    with VirtualCluster(2) as c:
        for r, g in enumerate(c.run(_gather_back, (3, 2), w)):
            np.testing.assert_array_equal(g, np.array_split(w, 2)[r])
        with pytest.raises(ShardingError, match="all_gather_invariant of pieces of uneven size along dim 0 "
                                                # either member may be the one reported
                                                r"\(this member's: [23] of 5\)"):
            c.run(_gather_back, (2, 3), w)  # not numpy.array_split's layout: where would its rows be?


def test_place_weights_places_all_or_none(cluster):
    """A bad W2 left the new W1, b1 on the devices beside the old W2, b2: the next execute computed
    with weights from two different sets, silently."""
    b, s, m, h = 2, 4, 8, 8
    rng = np.random.default_rng(1)
    x = rng.standard_normal((b, s, m))
    old, new = ([rng.standard_normal(sh) for sh in ((m, h), (h,), (h, m), (m,))] for _ in range(2))
    op = TensorParallelOp(FeedForward(FeedForwardShardingPolicy.named("megatron", MESH)),
                          ((b, s, m), (m, h), (h,), (h, m), (m,)), (b, s, m), weights=(1, 2, 3, 4))
    op.place_weights(cluster, *old)
    with pytest.raises(ShardingError, match=r"input 3 has shape \(8, 4\), expected \(8, 8\)"):
        op.place_weights(cluster, new[0], new[1], new[2][:, :4], new[3])
    w1, b1, w2, b2 = old
    np.testing.assert_allclose(cluster.execute(op, x), np.maximum(x @ w1 + b1, 0) @ w2 + b2, rtol=1e-12)


def test_the_estimates_take_no_hardware_or_a_preset_name():
    """policy_rows on a cluster started without hardware= and choose(..., "h100-node") failed with
    AttributeError: 'NoneType' (or 'str') object has no attribute 'intra_latency'."""
    assert choose(8, 8, 8, MESH, "h100-node").layer.name == choose(8, 8, 8, MESH, None).layer.name
    with pytest.raises(UsageError, match="unknown hardware 'tpu'"):
        choose(8, 8, 8, MESH, "tpu")
    with VirtualCluster(MESH) as c:
        rows = policy_rows(c, (8, 8, 8), names=("unsharded", "column"))
    assert [r.correct for r in rows] == [True, True]


def test_policies_json_is_json_and_says_what_did_not_apply(capsys):
    """Rows that cannot apply were "rel_error": NaN (no JSON parser but Python's takes it) and
    "correct": false, as if the result were wrong."""
    assert main(["policies", "--mesh", "x=4", "--shape", "8,8,8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    skipped = [r for r in rows if r["error"]]
    assert skipped and all(r["correct"] is None and r["rel_error"] is None for r in skipped)
    assert all(r["correct"] is True for r in rows if not r["error"])


def test_the_ffn_explorer_lists_each_program_once():
    """t=(x, y) and t=(y, x) shard over the same axes in mesh order: the same program, listed twice."""
    cands = explore_ffn(2, 8, 8, 8, Mesh({"x": 2, "y": 2, "z": 2}), "h100-node")
    programs = [(c.policy.name, tuple(format_layout(lay) for lay in c.policy.layouts())) for c in cands]
    assert len(programs) == len(set(programs))
    assert sum(name == "megatron" for name, _ in programs) == 7  # one per non-empty set of the 3 axes


def test_layouts_and_calls_that_are_wrong_say_so(cluster):
    assert parse_layout("[R,S(x)]") == parse_layout("[R, S(x)]") == ((), ("x",))
    assert parse_layout("[S(x, y), R]") == (("x", "y"), ())
    with pytest.raises(ShardingError,
                       match=r"2-d layouts for A \(m, k\) and B \(k, n\); got A\[R, R, R\] B\[R, R\]"):
        MatMulShardingPolicy.for_layouts("[R, R, R]", "[R, R]")  # was "too many values to unpack"
    column, inner = (MatMul(MatMulShardingPolicy.named(n, MESH)) for n in ("column", "matched_inner"))
    rng = np.random.default_rng(2)
    a, b, dc = (rng.standard_normal((4, 4)) for _ in range(3))
    with VirtualCluster(MESH) as fresh:
        with pytest.raises(UsageError,
                           match="run_backward has no forward to go back through on this cluster: "
                                             "call run_forward first"):
            run_backward(fresh, column, dc, [(4, 4), (4, 4)])  # was a device's KeyError 'tp.vjp'
        run_forward(fresh, inner, [a, b], (4, 4))
        # the devices hold matched_inner's saved values: a backward of column went through them
        with pytest.raises(UsageError, match=r"run_backward\(MatMul column: .*\) after a forward of MatMul "
                                             "matched_inner"):
            run_backward(fresh, column, dc, [(4, 4), (4, 4)])
        (da, db), _, _ = run_backward(fresh, inner, dc, [(4, 4), (4, 4)])
        np.testing.assert_allclose(da, dc @ b.T, rtol=1e-12)
        np.testing.assert_allclose(db, a.T @ dc, rtol=1e-12)
        # each forward is gone back through once
        with pytest.raises(UsageError, match="call run_forward first"):
            run_backward(fresh, inner, dc, [(4, 4), (4, 4)])


@pytest.mark.parametrize("make, said", [
    (lambda m3, m2: MatMulShardingPolicy.named("outer", m3, m="y"),
     r"policy 'outer' with k=y\+z, m=y shards A \[S\(y\), S\(y,z\)\]: mesh axis 'y' used twice"),
    (lambda m3, m2: FeedForwardShardingPolicy.named("sequence_parallel", m2, t="q"),
     r"role t=\('q',\) names unknown mesh axes \['q'\]; the mesh has axes \('x', 'y'\)"),
    (lambda m3, m2: FeedForwardShardingPolicy.named("gspmd", m2, x="y"),
     "shards x .*: mesh axis 'y' used twice"),
    (lambda m3, m2: MatMulShardingPolicy.named("unmatched_inner", m2, ka=("x", "y"), kb=("y", "x")),
     "both sharded over"),  # one sharding in mesh order: matched_inner's, not a different one
])
def test_named_policies_are_checked_when_made(make, said):
    """These were accepted, and refused (or, for unmatched_inner, run as a needlessly gathering
    program) only when they first ran."""
    with pytest.raises(ShardingError, match=said):
        make(Mesh({"x": 2, "y": 2, "z": 2}), MESH)
    assert str(MatMulShardingPolicy.named("matched_inner", MESH, k=("y", "x"))) == \
        str(MatMulShardingPolicy.named("matched_inner", MESH, k=("x", "y")))


def test_a_policys_peak_memory_does_not_depend_on_its_row():
    """The first row measured the cluster's one-time allocations too: unsharded showed 124,096 B
    per device and auto, the same program two rows later, 1,472."""
    with VirtualCluster(Mesh({"x": 4}), hardware="h100-node") as c:
        rows = {r.policy: r for r in policy_rows(c, (8, 8, 8), names=("unsharded", "column", "auto"))}
    assert rows["auto"].layouts.replace("·", " @ ") == rows["unsharded"].layouts
    assert rows["unsharded"].peak_bytes_per_device <= 1.25 * rows["auto"].peak_bytes_per_device
