"""``virtualpar policies``: every row correct and equal to its closed form; --json field names;
TensorParallelOp with resident weights."""

from __future__ import annotations

import json

import numpy as np
import pytest

from virtualpar import Mesh, VirtualCluster
from virtualpar.cli import main
from virtualpar.commands._args import parse_mesh
from virtualpar.errors import ShardingError
from virtualpar.tensor_parallel import MatMul, MatMulShardingPolicy
from virtualpar.tensor_parallel.execute import TensorParallelOp
from virtualpar.tensor_parallel.table import PolicyRow, policy_rows

FIELDS = set(PolicyRow.__dataclass_fields__)


@pytest.fixture(scope="module")
def cluster():
    with VirtualCluster(Mesh({"x": 2, "y": 2}), hardware="h100-node") as c:
        yield c


@pytest.mark.parametrize("ffn,shape", [(False, (32, 16, 24)), (True, (2, 8, 16, 32))], ids=["matmul", "ffn"])
def test_every_row_is_correct_and_matches_its_closed_form(cluster, ffn, shape):
    rows = policy_rows(cluster, shape, ffn=ffn, dtype=np.float64)
    assert rows and all(r.correct and r.matches_closed_form and not r.error for r in rows), rows
    assert all(r.rel_error <= 1e-12 and r.modelled_s > 0 for r in rows)
    by = {r.policy: r for r in rows}
    if not ffn:  # matched_inner: ring all_reduce of C (32·24·8 B) over 4 devices
        assert by["matched_inner"].bytes_device_to_device == 2 * 3 * 32 * 24 * 8 // 4
        assert by["unsharded"].bytes_device_to_device == 0


def test_resident_weights_are_sent_once(cluster):
    m, k, n = 16, 8, 12
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    op = TensorParallelOp(MatMul(MatMulShardingPolicy.named("column", cluster.mesh)), ((m, k), (k, n)),
                          (m, n), weights=(1,))
    placed = op.place_weights(cluster, b)
    assert placed == b.nbytes  # column: each device holds k·n/4, four devices
    for _ in range(2):
        cluster.reset_stats()
        np.testing.assert_allclose(cluster.execute(op, a), a @ b, rtol=1e-13)
        assert int(cluster.stats().host_to_device.sum()) == 4 * a.nbytes  # A replicated; B not re-sent
    with pytest.raises(ShardingError, match=r"input 0 has shape \(8, 8\), expected \(16, 8\)"):
        cluster.execute(op, np.zeros((8, 8)))


def test_weights_placed_on_a_closed_cluster_must_be_placed_again():
    m, k, n = 8, 8, 4
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    op = TensorParallelOp(MatMul(MatMulShardingPolicy.named("column", Mesh({"x": 2}))), ((m, k), (k, n)),
                          (m, n), weights=(1,))
    for _ in range(3):  # CPython often gives the next cluster the closed one's id
        with VirtualCluster(Mesh({"x": 2})) as c:
            with pytest.raises(ShardingError,
                               match=r"expected 2 arrays \(inputs \[0, 1\]\), got 1; the weights \(inputs "
                                                    r"\[1\]\) are not on this cluster: call place_weights"):
                c.execute(op, a)
            op.place_weights(c, b)
            np.testing.assert_allclose(c.execute(op, a), a @ b, rtol=1e-13)


def test_an_op_on_a_cluster_of_another_mesh_names_the_mesh_not_the_array_count():
    """It said 'expected 2 arrays (inputs [0, 1]), got 1': the count is checked after the mesh now."""
    op = TensorParallelOp(MatMul(MatMulShardingPolicy.named("column", Mesh({"x": 2, "y": 2}))),
                          ((8, 8), (8, 4)), (8, 4), weights=(1,))
    with VirtualCluster(Mesh({"x": 4})) as c:
        with pytest.raises(ShardingError,
                           match=r"dim 1 names mesh axis 'y'; the mesh \(x=4\) has axes \('x',\)"):
            c.execute(op, np.ones((8, 8)))


def test_cli_json_rows(capsys):
    assert main(["policies", "--mesh", "x=2,y=2", "--shape", "16,8,16", "--json", "--dtype", "float64"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ["unsharded", "matched_inner", "row", "unmatched_inner", "outer",
                                           "full", "column", "auto"]
    assert all(set(r) == FIELDS and r["correct"] for r in rows)


def test_cli_table_and_bad_shape(capsys):
    assert main(["policies", "--mesh", "t=2", "--shape", "2,4,8,8", "--ffn"]) == 0
    out = capsys.readouterr().out
    assert (
        "megatron" in out
        and "all_reduce(t)" in out
        and "gspmd: policy 'gspmd' needs a mesh with at least 2 axes" in out
    )
    # a policy that cannot apply reads n/a, not "NO" (which means a wrong result), and shows no zeros
    gspmd = next(line for line in out.splitlines() if line.startswith("gspmd "))
    assert gspmd.split()[1:] == ["n/a"] + ["-"] * 8
    assert main(["policies", "--mesh", "t=2", "--shape", "4,4"]) == 2


def test_explore_rows_run_every_candidate_right(capsys):
    assert main(["policies", "--mesh", "x=2,y=2", "--shape", "8,12,16", "--dtype", "float64", "--explore",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 81 and all(r["correct"] and r["matches_closed_form"] for r in rows)
    modelled = [r["modelled_closed_form_s"] for r in rows]
    assert modelled == sorted(modelled)
    assert main(["policies", "--mesh", "x=2,y=2", "--shape", "2,4,8,8", "--ffn", "--explore", "3"]) == 0
    out = capsys.readouterr().out
    assert "fastest modelled first" in out and out.count("yes ") == 3


@pytest.mark.parametrize("mesh, hardware",
                         [("x=4,y=4", "hardware h100-cluster;"), ("x=3,y=4", "hardware the mesh links;")])
def test_a_mesh_larger_than_a_node_picks_hardware_that_fits_it(capsys, mesh, hardware):
    """The default was one 8-GPU node, so any mesh past 8 devices failed unless --hardware was
    given; now it is the tour's and run's rule: a cluster of nodes for a multiple of 8, else the
    mesh's own links."""
    assert main(["policies", "--mesh", mesh, "--shape", "24,8,24", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    assert f"mesh {parse_mesh(mesh)}, {hardware}" in out and "NO " not in out
