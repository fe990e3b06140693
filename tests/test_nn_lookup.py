"""nn.pick and nn.rows_of: the values and gradients of plain indexing, keeping indices, not values."""

from __future__ import annotations

import autograd.numpy as anp
import numpy as np
from autograd import grad

from virtualpar import nn
from virtualpar.parallel.memory import saved_bytes

RNG = np.random.default_rng(3)


def test_pick_is_indexing_with_minus_one_as_nothing():
    x = RNG.normal(size=(2, 3, 5))
    cols = np.array([[4, 0, -1], [2, -1, 1]])
    want = np.array([[x[0, 0, 4], x[0, 1, 0], 0.0], [x[1, 0, 2], 0.0, x[1, 2, 1]]])
    assert np.array_equal(nn.pick(x, cols), want)
    weights = RNG.normal(size=cols.shape)
    g = grad(lambda v: anp.sum(nn.pick(v, cols) * weights))(x)
    by_hand = np.zeros_like(x)
    for i, j in np.ndindex(cols.shape):
        if cols[i, j] >= 0:
            by_hand[i, j, cols[i, j]] = weights[i, j]
    assert np.array_equal(g, by_hand)


def test_rows_of_is_an_embedding_lookup_whose_gradient_adds_repeated_ids():
    w = RNG.normal(size=(6, 4))
    ids = np.array([[1, 5, 1], [-1, 0, 1]])
    out = nn.rows_of(w, ids)
    assert np.array_equal(out[0], w[[1, 5, 1]])
    assert np.array_equal(out[1], np.stack([np.zeros(4), w[0], w[1]]))
    dy = RNG.normal(size=out.shape)
    g = grad(lambda v: anp.sum(nn.rows_of(v, ids) * dy))(w)
    by_hand = np.zeros_like(w)
    by_hand[1] = dy[0, 0] + dy[0, 2] + dy[1, 2]
    by_hand[5], by_hand[0] = dy[0, 1], dy[1, 1]
    assert np.allclose(g, by_hand, rtol=0, atol=1e-15)
    # the same bits as autograd's own indexing (which also scatters with np.add.at), masked
    safe, mask = np.where(ids >= 0, ids, 0), (ids >= 0)[..., None]
    assert np.array_equal(g, grad(lambda v: anp.sum(v[safe] * mask * dy))(w))

def test_neither_keeps_the_indexed_array_for_the_backward():
    """autograd's x[rows, cols] keeps all of x (b·s·V logits, to learn a shape); pick keeps the
    indices.  A cross-entropy then keeps the exponentials and the per-row sums, nothing else."""
    z = RNG.normal(size=(16, 32))
    labels = RNG.integers(0, 32, 16)

    def kept(fn) -> int:
        return saved_bytes(nn.vjp(lambda p, v: fn(v), z, params={}))

    assert kept(lambda v: anp.sum(v[np.arange(16), labels])) == z.nbytes
    assert kept(lambda v: anp.sum(nn.pick(v, labels))) == 0
    assert kept(lambda v: anp.sum(nn.rows_of(v, labels % 16))) == 0
    assert kept(lambda v: nn.cross_entropy(v, labels)) == z.nbytes + 16 * z.itemsize
