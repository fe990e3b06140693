"""Sharding specs, shard/unshard, redistribution plans on real clusters (results against numpy and
bytes against the closed forms), sharded operations with resident weights, and graphs."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest

from virtualpar import Mesh, ShardingError, UsageError, VirtualCluster
from virtualpar.ops import MATMUL, ShardedOperation
from virtualpar.sharding import DimSharding, TensorSharding, plan_redistribution, shard, unshard

MESH = Mesh({"dp": 2, "tp": 2})
T = TensorSharding.parse


def test_printable_forms_parse_back_exactly():
    for text in ("[S(tp), R]", "[R, S(dp,tp)]", "[R, R] P(sum)", "[S(dp), S(tp)] P(max)", "[R]", "[]"):
        assert str(T(text)) == text
    assert TensorSharding.of("tp", None) == T("[S(tp), R]")
    assert TensorSharding.of(("dp", "tp"), "R", partial="sum") == T("[S(dp,tp), R] P(sum)")
    with pytest.raises(ShardingError, match="cannot parse"):
        T("S(tp), R")


@pytest.mark.parametrize("text",
                         ["[S(tp), R]", "[R, S(dp,tp)]", "[S(dp), S(tp)]", "[R, R] P(sum)",
                          "[S(tp), R] P(sum)",
                                  "[R, R] P(max)"])
def test_shard_and_unshard_round_trip(text):
    x = np.random.default_rng(0).standard_normal((4, 8))
    spec = T(text)
    pieces = shard(x, spec, MESH)
    assert all(p.shape == spec.local_shape(x.shape, MESH, r) for r, p in enumerate(pieces))
    np.testing.assert_array_equal(unshard(pieces, spec, MESH), x)


def test_uneven_dims_raise_or_split_like_array_split():
    x = np.arange(10 * 3).reshape(10, 3)
    with pytest.raises(ShardingError,
                       match=r"cannot shard dim 0 of shape \(10, 3\) over mesh axis 'dp,tp' \(size 4\): "
                                            r"10 is not divisible by 4"):
        shard(x, T("[S(dp,tp), R]"), MESH)
    pieces = shard(x, T("[S(dp,tp), R]"), MESH, uneven="array_split")
    assert [p.shape[0] for p in pieces] == [len(a) for a in np.array_split(x, 4)]
    np.testing.assert_array_equal(unshard(pieces, T("[S(dp,tp), R]"), MESH, shape=x.shape), x)


def test_bad_specs_say_what_was_received_and_expected():
    with pytest.raises(ShardingError, match="uses mesh axis 'tp' twice"):
        shard(np.ones((4, 4)), T("[S(tp), S(tp)]"), MESH)
    with pytest.raises(ShardingError, match=r"names mesh axis 'pp', but the mesh's axes are \['dp', 'tp'\]"):
        shard(np.ones((4, 4)), T("[S(pp), R]"), MESH)
    with pytest.raises(ShardingError, match=r"has 1 dims but the shape \(4, 4\) has 2"):
        shard(np.ones((4, 4)), T("[R]"), MESH)


SPECS = ["[R, R]", "[S(dp), R]", "[S(tp), R]", "[R, S(tp)]", "[S(dp), S(tp)]", "[S(dp,tp), R]",
         "[R, R] P(sum)", "[S(dp), R] P(sum)"]
PAIRS = [(a, b) for a, b in itertools.product(SPECS, SPECS) if "P(" not in b]


def _redistribute(dev, plans):
    out = []
    for key, plan, local in plans[dev.rank]:
        out.append(plan.run(dev, local))
    return out


def test_every_redistribution_on_a_2x2_mesh_matches_numpy_and_its_byte_count():
    x = np.random.default_rng(1).standard_normal((8, 12))
    with VirtualCluster(MESH) as cluster:
        for a, b in PAIRS:
            plan = plan_redistribution(T(a), T(b), x.shape, MESH, x.dtype)
            pieces = shard(x, T(a), MESH)
            cluster.reset_stats()
            got = cluster.run(lambda dev, p, pcs: p.run(dev, pcs[dev.rank]), plan, pieces)
            want = shard(x, T(b), MESH)
            for r in range(MESH.size):
                np.testing.assert_allclose(got[r], want[r], rtol=1e-12, err_msg=f"{a} -> {b}, device {r}")
            sent = cluster.stats().bytes.sum(axis=1)
            assert list(sent) == [plan.bytes_per_device()] * MESH.size, f"{a} -> {b}: {plan.format()}"


def test_the_plan_uses_the_fewest_collectives():
    def kinds(a, b):
        return plan_redistribution(T(a), T(b), (8, 8), MESH).collectives
    assert kinds("[S(tp), R]", "[R, R]") == ["all_gather"]
    assert kinds("[R, R] P(sum)", "[R, R]") == ["all_reduce"]
    assert kinds("[R, R] P(sum)", "[S(dp,tp), R]") == ["reduce_scatter"]
    assert kinds("[S(tp), R]", "[R, S(tp)]") == ["all_to_all"]
    assert kinds("[R, R]", "[S(dp), S(tp)]") == []  # local slices
    text = plan_redistribution(T("[R, R] P(sum)"), T("[R, R]"), (8, 8), MESH).format("h100-node")
    assert "all_reduce(dp,tp) sum" in text and "768 B/device" in text and "modelled" in text


def _matmul_program(dev, a, b):
    """matched_inner: k sharded on A's columns and B's rows, partial products all-reduced."""
    return dev.all_reduce(MATMUL(dev, a, b), algorithm="ring")


def test_sharded_operation_with_resident_weights_sends_them_once():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((8, 16)), rng.standard_normal((16, 4))
    op = ShardedOperation(_matmul_program, [T("[R, S(dp,tp)]"), T("[S(dp,tp), R]")], [T("[R, R]")],
                          name="matmul")
    with VirtualCluster(MESH) as cluster:
        op.place(cluster, 1, b)
        cluster.reset_stats()
        np.testing.assert_allclose(cluster.execute(op, a), a @ b, rtol=1e-12)
        first = cluster.stats().host_to_device.sum()
        np.testing.assert_allclose(cluster.execute(op, a), a @ b, rtol=1e-12)
        second = cluster.stats().host_to_device.sum() - first
    assert first == second and first < a.nbytes + b.nbytes  # A's pieces only, each call


def test_weights_placed_on_a_closed_cluster_are_not_taken_for_placed_on_the_next():
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((8, 16)), rng.standard_normal((16, 4))
    op = ShardedOperation(_matmul_program, [T("[R, S(dp,tp)]"), T("[S(dp,tp), R]")], [T("[R, R]")],
                          name="matmul")
    for _ in range(3):  # CPython often gives the next cluster the closed one's id
        with VirtualCluster(MESH) as cluster:
            with pytest.raises(UsageError, match="expected 2 host inputs, got 1"):
                cluster.execute(op, a)
            op.place(cluster, 1, b)
            with pytest.raises(UsageError, match="expected 1 host inputs, got 2"):  # b again, though placed
                cluster.execute(op, a, b)
            np.testing.assert_allclose(cluster.execute(op, a), a @ b, rtol=1e-12)


def test_a_graph_runs_in_order_and_redistributes_between_nodes():
    rng = np.random.default_rng(3)
    a, b, c = rng.standard_normal((8, 8)), rng.standard_normal((8, 8)), rng.standard_normal((8, 4))
    g = nx.DiGraph(inputs=[("ab", 0), ("ab", 1), ("abc", 1)])
    # A·B with k sharded: a partial result; the next matmul wants it row-sharded: reduce_scatter
    g.add_node("ab",
               op=ShardedOperation(lambda dev, x, y: MATMUL(dev, x, y),
                                   [T("[R, S(dp,tp)]"), T("[S(dp,tp), R]")],
                                         [T("[R, R] P(sum)")]))
    g.add_node("abc",
               op=ShardedOperation(lambda dev, x, y: MATMUL(dev, x, y), [T("[S(dp,tp), R]"), T("[R, R]")],
                                          [T("[S(dp,tp), R]")]))
    g.add_edge("ab", "abc", port=0)
    with VirtualCluster(MESH) as cluster:
        np.testing.assert_allclose(cluster.execute(g, a, b, c), a @ b @ c, rtol=1e-12)


def test_a_partial_over_some_axes_keeps_copies_on_the_others():
    x = np.random.default_rng(4).standard_normal((4, 4))
    spec = T("[R, R] P(sum:tp)")
    assert str(spec) == "[R, R] P(sum:tp)" and spec.partial_axes(MESH) == ("tp",)
    pieces = shard(x, spec, MESH)
    np.testing.assert_array_equal(unshard(pieces, spec, MESH), x)
    plan = plan_redistribution(spec, T("[R, R]"), x.shape, MESH)
    assert [(s.collective, s.axes) for s in plan.steps] == [("all_reduce", ("tp",))]
    with pytest.raises(ShardingError, match="reduces over an axis that also shards"):
        shard(x, T("[S(tp), R] P(sum:tp)"), MESH)


def _to_sharding(layout):
    return TensorSharding(tuple(DimSharding(tuple(axes)) for axes in layout))


def test_the_tensor_parallel_explorer_derives_the_plans_collectives():
    """For every assignment of a 2x2 mesh's axes to A's and B's dims, the explorer's own gathers
    and its final all_reduce are what plan_redistribution chooses for the same layout changes."""
    from virtualpar.tensor_parallel.explore import assignments, derive

    checked = 0
    for a, b in assignments(MESH):
        d = derive(a, b)
        (am, ak), (bk, bn) = a, b
        partial = ak if ak and ak == bk else ()
        bn_keep = () if set(bn) & set(am) else bn
        for name, src, dst in (("A", a, (am, partial)), ("B", b, (partial, bn_keep))):
            plan = plan_redistribution(_to_sharding(src), _to_sharding(dst), (8, 8), MESH)
            want = sorted(ax for s in plan.steps if s.collective == "all_gather" for ax in s.axes)
            got = sorted(s.axis for s in d.steps if s.tensor == name and s.op.startswith("all_gather"))
            assert got == want, (name, src, dst, plan.format())
            assert all(s.collective in ("all_gather", "slice") for s in plan.steps)
        c_src = TensorSharding((DimSharding(tuple(am)), DimSharding(tuple(bn_keep))), "sum",
                               tuple(partial)) if partial \
            else _to_sharding((am, bn_keep))
        plan = plan_redistribution(c_src, _to_sharding((am, bn_keep)), (8, 8), MESH)
        assert sorted(ax for s in plan.steps for ax in s.axes) == sorted(
            s.axis for s in d.steps if s.op == "g"
        )
        checked += 1
    assert checked == 81
