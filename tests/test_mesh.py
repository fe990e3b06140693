"""Mesh and MeshIndex: row-major rank math against numpy, hand-written groups, every error message."""

from __future__ import annotations

import itertools
import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from virtualpar.errors import MeshError
from virtualpar.mesh import Mesh, MeshIndex, Topology

NAMES = ("dp", "pp", "tp", "sp")
shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4)


def make(sizes):
    return Mesh(dict(zip(NAMES, sizes)))


# -- ranks <-> coordinates ---------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(shapes)
def test_rank_index_round_trip_matches_numpy(sizes):
    mesh = make(sizes)
    assert mesh.size == math.prod(sizes) and mesh.ndim == len(sizes)
    for r in range(mesh.size):
        idx = mesh.index(r)
        assert tuple(idx) == tuple(int(c) for c in np.unravel_index(r, sizes))  # C order = row-major
        assert mesh.rank(idx) == r == mesh.rank(tuple(idx)) == mesh.rank(**idx.as_dict())
        assert int(np.ravel_multi_index(tuple(idx), sizes)) == r


def test_last_axis_fastest():
    mesh = Mesh({"dp": 2, "tp": 4})
    assert [tuple(mesh.index(r)) for r in range(8)] == [(d, t) for d in range(2) for t in range(4)]
    assert mesh.rank(dp=1, tp=2) == 6 and mesh.index(6).tp == 2 and mesh.index(6)["dp"] == 1


@settings(max_examples=60, deadline=None)
@given(shapes, st.data())
def test_groups_partition_and_agree_outside(sizes, data):
    mesh = make(sizes)
    names = mesh.axis_names
    axes = data.draw(st.lists(st.sampled_from(names), unique=True))
    groups = mesh.groups(axes)
    assert sorted(r for g in groups for r in g) == list(range(mesh.size))
    assert [g[0] for g in groups] == sorted(g[0] for g in groups) and all(g[0] == min(g) for g in groups)
    for g in groups:
        assert len(g) == math.prod(mesh.shape[a] for a in axes)
        outside = {tuple(c for n, c in mesh.index(r).as_dict().items() if n not in axes) for r in g}
        assert len(outside) == 1
        inside = [tuple(c for n, c in mesh.index(r).as_dict().items() if n in axes) for r in g]
        assert inside == sorted(inside)  # row-major over the group axes
        for r in g:
            assert mesh.group_of(r, axes) == g


def test_groups_2x4_by_hand():
    mesh = Mesh({"dp": 2, "tp": 4})
    assert mesh.groups("tp") == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert mesh.groups(["dp"]) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert mesh.groups(("tp", "dp")) == mesh.groups(None) == [tuple(range(8))]
    assert mesh.groups(()) == [(r,) for r in range(8)]
    assert mesh.group_of(6, "tp") == (4, 5, 6, 7) and mesh.group_of(6, "dp") == (2, 6)
    assert mesh.group_of(3, None) == tuple(range(8))


def test_groups_2x2x2_by_hand():
    mesh = Mesh((2, 2, 2), ("dp", "pp", "tp"))  # rank = 4*dp + 2*pp + tp
    expected = {
        ("dp",): [(0, 4), (1, 5), (2, 6), (3, 7)],
        ("pp",): [(0, 2), (1, 3), (4, 6), (5, 7)],
        ("tp",): [(0, 1), (2, 3), (4, 5), (6, 7)],
        ("dp", "pp"): [(0, 2, 4, 6), (1, 3, 5, 7)],
        ("dp", "tp"): [(0, 1, 4, 5), (2, 3, 6, 7)],
        ("pp", "tp"): [(0, 1, 2, 3), (4, 5, 6, 7)],
        ("dp", "pp", "tp"): [(0, 1, 2, 3, 4, 5, 6, 7)],
    }
    for axes, groups in expected.items():
        assert mesh.groups(axes) == groups
        assert mesh.groups(axes[::-1]) == groups  # axis order in the argument does not matter
    assert mesh.group_of(5, ("tp", "dp")) == (0, 1, 4, 5)
    assert mesh.group_of(5, "pp") == (5, 7)


def test_groups_returns_fresh_list():
    mesh = Mesh({"dp": 2, "tp": 2})
    mesh.groups("tp").clear()
    assert mesh.groups("tp") == [(0, 1), (2, 3)]


def test_axes_normalised_to_mesh_order():
    mesh = Mesh({"dp": 2, "pp": 1, "tp": 4})
    assert mesh.axes(None) == ("dp", "pp", "tp")
    assert mesh.axes("tp") == ("tp",)
    assert mesh.axes(["tp", "dp"]) == ("dp", "tp")
    assert mesh.axes(()) == ()
    assert mesh.axis_size("tp") == 4


# -- construction, properties, value semantics ------------------------------------------------------

def test_constructors_agree():
    a = Mesh({"dp": 2, "tp": 4})
    b = Mesh((2, 4), ("dp", "tp"))
    c = Mesh([np.int64(2), 4], ["dp", "tp"])
    assert a == b == c and hash(a) == hash(b) == hash(c)
    assert a.shape == {"dp": 2, "tp": 4} and list(a.shape) == ["dp", "tp"]
    assert a.axis_names == ("dp", "tp") and a.sizes == (2, 4)
    with pytest.raises(TypeError):
        a.shape["dp"] = 3  # type: ignore[index]
    with pytest.raises(AttributeError):
        a.foo = 1  # type: ignore[attr-defined]
    assert Mesh(8) == Mesh((8,)) == Mesh({"world": 8}) and Mesh(8).axis_names == ("world",)
    assert Mesh(4, "dp").axis_names == ("dp",)
    assert Mesh({"dp": 2, "tp": 4}) != Mesh({"tp": 4, "dp": 2})
    assert str(a) == "(dp=2, tp=4)" and repr(a) == "Mesh({'dp': 2, 'tp': 4}, topology=fully_connected(8))"


def test_topology_default_custom_and_pickle():
    mesh = Mesh({"dp": 2, "tp": 4})
    assert mesh.topology == Topology.fully_connected(8)
    assert mesh == Mesh({"dp": 2, "tp": 4}, topology=Topology.fully_connected(8))
    ring = Mesh({"dp": 2, "tp": 4}, topology=Topology.ring(8))
    assert ring != mesh and ring.topology.name == "ring(8)"
    for m in (mesh, ring, Mesh(1), Mesh({"pp": 2, "dp": 2, "tp": 2}, topology=Topology.hierarchical(2, 4))):
        u = pickle.loads(pickle.dumps(m))
        assert u == m and hash(u) == hash(m) and u.topology == m.topology
        assert u.groups("dp" if "dp" in m.axis_names else None) == m.groups(
            "dp" if "dp" in m.axis_names else None
        )
    assert len({mesh, ring, pickle.loads(pickle.dumps(mesh))}) == 2


def test_for_devices_and_check_devices():
    assert Mesh.for_devices(8, {"dp": 2, "tp": 4}).size == 8
    Mesh(4).check_devices(4)
    with pytest.raises(MeshError, match=r"mesh shape \(dp=2, tp=4\) holds 8 devices, but 6 were asked for"):
        Mesh.for_devices(6, {"dp": 2, "tp": 4})
    with pytest.raises(MeshError, match=r"mesh shape \(world=2\) holds 2 devices, but 1 was asked for"):
        Mesh(2).check_devices(1)


# -- MeshIndex -------------------------------------------------------------------------------------

def test_mesh_index():
    idx = Mesh({"dp": 2, "tp": 4}).index(6)
    assert str(idx) == repr(idx) == "(dp=1, tp=2)"
    assert (idx.dp, idx.tp, idx["tp"], idx[0], len(idx)) == (1, 2, 2, 1, 2)
    assert tuple(idx) == (1, 2) and idx.as_dict() == {"dp": 1, "tp": 2} and idx.axis_names == ("dp", "tp")
    assert idx == MeshIndex(("dp", "tp"), (1, 2)) and idx == (1, 2)
    assert idx != MeshIndex(("a", "b"), (1, 2)) and idx != MeshIndex(("dp", "tp"), (1, 3))
    assert hash(idx) == hash(MeshIndex(("dp", "tp"), (1, 2)))
    back = pickle.loads(pickle.dumps(idx))
    assert back == idx and back.axis_names == idx.axis_names and str(back) == "(dp=1, tp=2)"
    with pytest.raises(AttributeError,
                       match=r"unknown mesh axis 'pp'; this index has axes \('dp', 'tp'\)") as info:
        idx.pp
    assert isinstance(info.value, MeshError) and not hasattr(idx, "pp") and getattr(idx, "pp", 7) == 7
    with pytest.raises(MeshError, match=r"unknown mesh axis 'pp'"):
        idx["pp"]
    with pytest.raises(AttributeError):
        idx.dp = 0  # type: ignore[misc]
    with pytest.raises(MeshError, match=r"one coordinate per axis"):
        MeshIndex(("dp", "tp"), (1,))


# -- errors ----------------------------------------------------------------------------------------

M = Mesh({"dp": 2, "tp": 4})


@pytest.mark.parametrize("call,match", [
    (lambda: Mesh({}), r"at least one axis"),
    (lambda: Mesh(()), r"at least one axis"),
    (lambda: Mesh((2, 2), ("dp", "dp")), r"duplicate mesh axis name 'dp' in \('dp', 'dp'\)"),
    (lambda: Mesh({"": 2}), r"non-empty identifiers .* got ''"),
    (lambda: Mesh({"my axis": 2}), r"got 'my axis'"),
    (lambda: Mesh({"_x": 2}), r"got '_x'"),
    (lambda: Mesh({"as_dict": 2}), r"got 'as_dict'"),
    (lambda: Mesh((2, 4), (1, 2)), r"got 1"),
    (lambda: Mesh({"dp": 0, "tp": 4}), r"mesh axis 'dp' has size 0; axis sizes must be positive"),
    (lambda: Mesh({"dp": -2}), r"mesh axis 'dp' has size -2"),
    (lambda: Mesh({"dp": 2.0}), r"size of mesh axis 'dp' must be an integer; got 2.0"),
    (lambda: Mesh({"dp": True}), r"size of mesh axis 'dp' must be an integer; got True"),
    (lambda: Mesh((2, 4)), r"shape \(2, 4\) needs axis_names"),
    (lambda: Mesh((2, 4), ("dp",)), r"shape \(2, 4\) has 2 axes but 1 axis names were given"),
    (lambda: Mesh({"dp": 2}, ("tp",)), r"not both"),
    (lambda: Mesh("dp"), r"a mesh shape is an int"),
    (lambda: Mesh(8, topology=Topology.ring(4)),
     r"\(world=8\) holds 8 devices, but its topology ring\(4\) has 4"),
    (lambda: Mesh(8, topology="ring"), r"topology must be a Topology; got str"),
    (lambda: M.groups("pp"), r"unknown mesh axis 'pp'; this mesh has axes \('dp', 'tp'\)"),
    (lambda: M.groups(("dp", "pp")), r"unknown mesh axis 'pp'"),
    (lambda: M.groups(("dp", "dp")), r"name an axis twice"),
    (lambda: M.groups(3), r"a name, a sequence of names or None; got 3"),
    (lambda: M.group_of(0, "sp"), r"unknown mesh axis 'sp'"),
    (lambda: M.group_of(8, "tp"),
     r"rank 8 is out of range for mesh \(dp=2, tp=4\) with 8 devices \(valid ranks: 0..7\)"),
    (lambda: M.index(-1), r"rank -1 is out of range"),
    (lambda: M.index(1.5), r"a rank must be an integer; got 1.5"),
    (lambda: M.rank((2, 0)), r"coordinate dp=2 is out of range for mesh \(dp=2, tp=4\): valid 0..1"),
    (lambda: M.rank(dp=0, tp=4), r"coordinate tp=4 is out of range .* valid 0..3"),
    (lambda: M.rank((0, -1)), r"coordinate tp=-1"),
    (lambda: M.rank((0,)), r"index \(0,\) has 1 coordinates; mesh \(dp=2, tp=4\) has 2 axes"),
    (lambda: M.rank(dp=1), r"exactly one keyword per mesh axis .* missing: \['tp'\]"),
    (lambda: M.rank(dp=1, tp=0, pp=0), r"unknown: \['pp'\]"),
    (lambda: M.rank(), r"exactly one keyword per mesh axis"),
    (lambda: M.rank((0, 1), tp=1), r"not both"),
    (lambda: M.rank(MeshIndex(("a", "b"), (0, 1))),
     r"index \(a=0, b=1\) has axes \('a', 'b'\); this mesh has axes"),
    (lambda: M.axis_size("pp"), r"unknown mesh axis 'pp'"),
    (lambda: M.describe_group("pp", (0, 1)), r"unknown mesh axis 'pp'"),
    (lambda: Mesh(2).check_devices("2"), r"device count must be an integer"),
])
def test_errors(call, match):
    with pytest.raises(MeshError, match=match):
        call()


def test_mesh_error_is_value_error():
    with pytest.raises(ValueError):
        M.groups("pp")


def test_describe_group():
    mesh = Mesh({"dp": 2, "tp": 8})
    assert mesh.describe_group("tp", (0, 1, 2, 3)) == "tp=(0,1,2,3)"
    assert mesh.describe_group(("tp", "dp"), range(4)) == "dp,tp=(0,1,2,3)"
    assert mesh.describe_group(None, range(16)) == "world=(0,1,...,15)"
    assert mesh.describe_group("dp", (3, 11)) == "dp=(3,11)"
    assert mesh.describe_group((), (5,)) == "rank=(5)"
    irregular = (0, 1, 3, 4, 5, 6, 7, 8, 9)
    assert mesh.describe_group(None, irregular) == "world=(0,1,3,4,5,6,7,8,9)"
    assert [mesh.describe_group("dp", g) for g in mesh.groups("dp")][:2] == ["dp=(0,8)", "dp=(1,9)"]


def test_large_mesh_index_math_is_cheap():
    mesh = Mesh({"dp": 64, "tp": 64})  # the default topology is only built when asked for
    assert mesh.index(4095) == (63, 63) and len(mesh.groups("tp")) == 64
    assert pickle.loads(pickle.dumps(mesh)) == mesh
    assert list(itertools.islice(mesh.group_of(4095, "dp"), 2)) == [63, 127]
