"""``nn.recompute.recomputed``: the same values and gradients as the function traced whole, keeping
only the segment's inputs for the backward."""

from __future__ import annotations

import autograd.numpy as anp
import numpy as np
from autograd import grad

from virtualpar import nn
from virtualpar.nn.recompute import recomputed
from virtualpar.parallel.memory import saved_bytes


def tanh_gelu(x, w):
    return 0.5 * x * (1.0 + anp.tanh(0.79788456 * (x + 0.044715 * x ** 3))) * w


def test_values_and_gradients_are_those_of_the_whole_trace_bit_for_bit():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 5)), rng.standard_normal(5)
    whole = grad(lambda x, w: anp.sum(tanh_gelu(x, w) ** 2), (0, 1))(x, w)
    seg = grad(lambda x, w: anp.sum(recomputed(tanh_gelu, x, w) ** 2), (0, 1))(x, w)
    assert all(np.array_equal(a, b) for a, b in zip(whole, seg))
    only_w = grad(lambda w: anp.sum(recomputed(tanh_gelu, x, w)))(w)  # x not differentiated
    assert np.array_equal(only_w, grad(lambda w: anp.sum(tanh_gelu(x, w)))(w))


def test_a_segment_keeps_its_inputs_and_nothing_inside_it():
    """The whole trace keeps ~6 arrays of x's size (x³, the tanh, ...); the segment keeps x alone."""
    x = np.random.default_rng(1).standard_normal((4, 8))
    w = np.ones(8)
    whole = nn.vjp(lambda p, x: tanh_gelu(x, p["w"]), x, params={"w": w})
    seg = nn.vjp(lambda p, x: recomputed(tanh_gelu, x, p["w"]), x, params={"w": w})
    assert saved_bytes(seg, [w]) == x.nbytes
    assert saved_bytes(whole, [w]) >= 4 * x.nbytes
    dy = np.ones((4, 8))
    (dx1, g1), (dx2, g2) = whole.backward(dy), seg.backward(dy)
    assert np.array_equal(dx1, dx2) and np.array_equal(g1["w"], g2["w"])


def test_an_input_the_output_does_not_depend_on_gets_a_zero_gradient():
    x, y = np.ones(3), np.full(3, 2.0)
    g = grad(lambda x, y: anp.sum(recomputed(lambda a, b: a * 3.0, x, y)), (0, 1))(x, y)
    assert np.array_equal(g[0], np.full(3, 3.0)) and np.array_equal(g[1], np.zeros(3))
