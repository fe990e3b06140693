"""Pins what ``virtualpar.nn._autograd`` relies on from autograd's internals (and the one public
behaviour nn leans on: ``notrace_primitive`` as a stop-gradient).  An autograd release that
changes any of it fails one of these named tests, not a training run far away."""

from __future__ import annotations

import autograd
import autograd.numpy as anp
import numpy as np
import pytest
from autograd.extend import notrace_primitive

from virtualpar.nn._autograd import record, unbox


def test_the_internals_relied_on_exist_under_their_names():
    import autograd.core as core
    import autograd.tracer as tracer
    import autograd.util as util

    assert callable(core.VJPNode.new_root) and callable(core.add_outgrads)
    assert callable(tracer.trace_stack.new_trace) and callable(tracer.new_box)
    assert callable(tracer.isbox) and callable(tracer.getval) and callable(util.toposort)
    node = core.VJPNode.new_root()
    assert node.parents == [] and node.vjp(1.0) == ()


def test_each_root_gets_its_own_gradient_and_unused_or_constant_values_get_none():
    a, b, c, k = np.array([1.0, 2.0]), np.array([3.0, -1.0]), np.array([5.0]), np.array([2, 3])
    seen = {}

    def f(a, b, c, k):
        seen["k"] = type(k)
        return anp.sum(a * b * k) + anp.sum(anp.sin(a))

    out, back = record(f, [a, b, c, k], [True, True, True, False])
    assert unbox(out) == pytest.approx(np.sum(a * b * k) + np.sum(np.sin(a)))  # raw: still a box
    assert seen["k"] is np.ndarray  # not differentiated: passed as it is, never boxed
    ga, gb, gc, gk = back(2.0)
    np.testing.assert_allclose(ga, 2.0 * (b * k + np.cos(a)), rtol=1e-15)
    np.testing.assert_allclose(gb, 2.0 * a * k, rtol=1e-15)
    assert gc is None and gk is None


def test_gradients_of_one_value_read_several_times_by_indexing_are_summed_dense():
    a = np.array([1.0, 2.0, 3.0])
    _, back = record(lambda a: a[0] * a[1] + 3.0 * a[0] + a[0:2].sum(), [a], [True])
    (g,) = back(1.0)
    assert isinstance(g, np.ndarray) and g.shape == (3,)
    np.testing.assert_allclose(g, [2.0 + 3.0 + 1.0, 1.0 + 1.0, 0.0])


def test_an_output_that_does_not_depend_on_any_root_gives_none_everywhere():
    _, back = record(lambda a: np.ones(2), [np.zeros(2)], [True])
    assert back(np.ones(2)) == [None]


def test_a_packed_tuple_output_takes_a_tuple_cotangent():
    a = np.array([1.0, 2.0])
    out, back = record(lambda a: (a * 2.0, anp.sum(a * a)), [a], [True], pack=lambda o: autograd.tuple(o))
    assert isinstance(out, tuple) and len(out) == 2  # the raw output, not the packed one
    (g,) = back((np.array([1.0, 10.0]), 3.0))
    np.testing.assert_allclose(g, [2.0 + 6.0 * 1.0, 20.0 + 6.0 * 2.0])


def test_float32_roots_keep_float32_gradients_through_elementwise_ops():
    a = np.array([1.0, 2.0], np.float32)
    _, back = record(lambda a: anp.sum(a * a * 3.0), [a], [True])
    assert back(np.float32(1.0))[0].dtype == np.float32


def test_unbox_gives_the_plain_array_inside_a_trace_and_inside_nested_traces():
    a = np.array([1.0, 2.0])
    seen = []

    def inner(x):
        seen.append(type(unbox(x)))
        return anp.sum(x * x)

    record(inner, [a], [True])
    autograd.grad(lambda y: record(inner, [y], [True]) and anp.sum(y))(a)  # inner sees a box of a box
    assert seen == [np.ndarray, np.ndarray]
    assert unbox(a) is a


def test_notrace_primitive_is_a_stop_gradient():
    """nn's softmaxes shift by a row max computed through ``notrace_primitive``: autograd must hand
    it plain values and record no gradient through it."""
    seen = []

    @notrace_primitive
    def row_max(x):
        seen.append(type(x))
        return np.max(x, axis=-1, keepdims=True)

    z = np.array([[1.0, 3.0], [2.0, 0.5]])
    _, back = record(lambda z: anp.sum(z - row_max(z)), [z], [True])
    np.testing.assert_array_equal(back(1.0)[0], np.ones_like(z))  # the max contributed nothing
    assert seen == [np.ndarray]
