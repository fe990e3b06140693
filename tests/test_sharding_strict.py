"""Strict specs: malformed text is refused with the column of the error, and every axis a spec
names — a pending reduction's included — must be an axis of the mesh it meets (no process needed)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from virtualpar import Mesh, ShardingError
from virtualpar.sharding import DimSharding, TensorSharding, plan_redistribution, shard

MESH = Mesh({"dp": 2, "tp": 2})
T = TensorSharding.parse


@pytest.mark.parametrize("text, column, problem", [
    ("[S(x) R]", 6, "expected ',' between entries or ']'"),
    ("[R,, R]", 3, "empty entry"),
    ("[R, ]", 4, "empty entry"),
    ("[, R]", 1, "empty entry"),
    ("S(tp), R", 0, "expected '\\['"),
    ("[S()]", 3, "expected a mesh axis name"),
    ("[S(x,)]", 5, "empty entry, expected a mesh axis name"),
    ("[S(x y)]", 5, "expected ',' or '\\)'"),
    ("[Rx]", 1, "expected R or S"),
    ("[R] P(foo)", 6, "unknown reduce op 'foo'"),
    ("[R] P(sum", 9, "expected '\\)'"),
    ("[R] P(sum:)", 10, "expected a mesh axis name"),
    ("[R] Q", 4, "expected the end of the spec or a pending reduction"),
    ("[R] P(sum) R", 11, "expected the end of the spec"),
    ("[R", 2, "expected ']'"),
])
def test_malformed_specs_are_refused_at_the_column_of_the_error(text, column, problem):
    head = re.escape(f"bad spec {text!r} at column {column}: ")
    with pytest.raises(ShardingError, match="^" + head + problem) as info:
        T(text)
    assert info.value.column == column
    assert str(info.value).splitlines()[-1] == " " * (4 + column) + "^"  # the caret under the column


def test_the_issues_example_reads_as_promised():
    with pytest.raises(ShardingError) as info:
        T("[R,, R]")
    assert str(info.value).startswith("bad spec '[R,, R]' at column 3: empty entry")


def test_well_formed_specs_parse_with_any_spacing_and_print_canonically():
    spaced = T(" [ R ,S( dp , tp ) ]  P( sum : dp ) ")
    assert spaced == TensorSharding((DimSharding(), DimSharding(("dp", "tp"))), "sum", ("dp",))
    for text in ("[S(tp), R]", "[R, S(dp,tp)]", "[R, R] P(sum)", "[R] P(sum:dp,tp)", "[R]", "[]"):
        assert str(T(text)) == text and T(str(T(text))) == T(text)
    assert DimSharding.parse(" S(a, b) ") == DimSharding(("a", "b"))
    assert DimSharding.parse("R") == DimSharding()
    with pytest.raises(ShardingError, match="bad dim sharding 'S\\(a\\) R' at column 5"):
        DimSharding.parse("S(a) R")
    with pytest.raises(ShardingError, match="a spec is text like"):
        T(["R"])


def test_a_partial_sum_over_an_unknown_axis_is_refused_where_the_spec_meets_the_mesh():
    spec = T("[R, R] P(sum:pp)")  # fine as text: the axes are a mesh's business
    for call in (lambda: spec.check((4, 4), MESH), lambda: shard(np.ones((4, 4)), spec, MESH),
                 lambda: plan_redistribution(spec, T("[R, R]"), (4, 4), MESH),
                 lambda: spec.partial_axes(MESH)):
        with pytest.raises(ShardingError, match=r"names mesh axis 'pp'") as info:
            call()
        assert info.value.axis == "pp" and "pending reduction P(sum)" in str(info.value)
        assert "['dp', 'tp']" in str(info.value) or "('dp', 'tp')" in str(info.value)
    said = r"tensor: spec \[R, R\] P\(sum:pp\) names mesh axis 'pp', but the mesh's axes are \['dp', 'tp'\] "
    with pytest.raises(ShardingError, match=said + r"\(in its pending reduction P\(sum\)\)"):
        shard(np.ones((4, 4)), spec, MESH)
    with pytest.raises(ShardingError, match="names an axis of its pending reduction twice"):
        T("[R, R] P(sum:dp,dp)").check((4, 4), MESH)
    assert T("[R, R] P(sum:tp)").partial_axes(MESH) == ("tp",)


def test_an_unknown_axis_of_a_named_tensor_names_the_tensor_the_dim_and_the_mesh():
    with pytest.raises(ShardingError, match=r"^weights: \[R, S\(zz\)\]: dim 1 names mesh axis 'zz'; the mesh "
                                            r"\(dp=2, tp=2\) has axes \('dp', 'tp'\)"):
        T("[R, S(zz)]").check((4, 4), MESH, name="weights")
