"""Every layer's and loss's gradient against central finite differences in float64, and
value_and_grad of an MLP against a backward written by hand in numpy."""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar import nn

RNG = np.random.default_rng(0)


def numeric_grads(f, params: dict[str, np.ndarray], eps: float = 1e-6) -> dict[str, np.ndarray]:
    """Central differences of the scalar f(params) w.r.t. every entry of every array."""
    out = {}
    for name, value in params.items():
        g = np.zeros_like(value)
        for idx in np.ndindex(value.shape):
            old = value[idx]
            value[idx] = old + eps
            hi = f(params)
            value[idx] = old - eps
            lo = f(params)
            value[idx] = old
            g[idx] = (hi - lo) / (2 * eps)
        out[name] = g
    return out


def check_module(model: nn.Module, x: np.ndarray, head=lambda y: y, tol: float = 1e-6) -> None:
    """d/dparams and d/dx of sum(w * head(model(x))) by autograd == by finite differences."""
    y0 = head(model(x))
    w = np.random.default_rng(1).standard_normal(np.shape(y0))

    def scalar(p):
        inputs = p["__x"]
        with model._bound({k: v for k, v in p.items() if k != "__x"}):
            return float(np.sum(w * head(model(inputs))))

    params = {k: v.copy() for k, v in model.parameters().items()}
    params["__x"] = x.copy()
    want = numeric_grads(scalar, params)
    rec = nn.vjp(model, x)
    dx, dparams = rec.backward(w) if not isinstance(rec.output, tuple) else (None, None)
    if dx is None:  # recurrent layers return (outputs, states): differentiate through head
        loss, grads = nn.value_and_grad(lambda m, a: (w * head(m(a))).sum(), model, x)
        dparams = grads
        dx = nn.vjp(lambda p, a: (w * head(nn.functional_call(model, p, a))).sum(), x,
                    params=model.parameters()).backward(1.0)[0]
    for name, g in dparams.items():
        np.testing.assert_allclose(g, want[name], rtol=tol, atol=tol, err_msg=name)
    np.testing.assert_allclose(dx, want["__x"], rtol=tol, atol=tol, err_msg="input")


@pytest.mark.parametrize("make", [
    lambda: nn.Linear(4, 3, seed=3, dtype=np.float64),
    lambda: nn.Linear(4, 3, bias=False, seed=3, dtype=np.float64),
    lambda: nn.Sequential(nn.Linear(4, 5, dtype=np.float64), nn.Tanh(),
                          nn.Linear(5, 2, seed=1, dtype=np.float64)),
    lambda: nn.GELU(),
    lambda: nn.GELU(approximate="tanh"),
    lambda: nn.ReLU(),
    lambda: nn.Tanh(),
    lambda: nn.LayerNorm(4, dtype=np.float64),
], ids=["linear", "linear-nobias", "mlp", "gelu", "gelu-tanh", "relu", "tanh", "layernorm"])
def test_layer_gradients_match_finite_differences(make):
    model = make()
    if isinstance(model, nn.LayerNorm):  # non-trivial affine parameters
        model.weight = RNG.standard_normal(4)
        model.bias = RNG.standard_normal(4)
    x = RNG.standard_normal((3, 4)) + 0.05  # keep relu's kink away from the sample points
    check_module(model, x)


@pytest.mark.parametrize("cls", [nn.RNN, nn.GRU])
def test_recurrent_gradients_through_time_and_layers(cls):
    model = cls(3, 4, num_layers=2, seed=5, dtype=np.float64)
    x = RNG.standard_normal((2, 5, 3))
    check_module(model, x, head=lambda out: out[0][:, -1, :] + out[1].sum(axis=0))
    # through an initial state as well
    h0 = RNG.standard_normal((2, 2, 4))
    w = RNG.standard_normal((2, 5, 4))
    f = lambda p: float(np.sum(w * nn.functional_call(model, {k: v for k, v in p.items() if k != "h0"}, x,
                                                      p["h0"])[0]))
    params = dict(model.parameters(), h0=h0.copy())
    want = numeric_grads(f, {k: v.copy() for k, v in params.items()})
    got = nn.vjp(lambda p, a, h: (w * nn.functional_call(model, p, a, h)[0]).sum(), x, h0,
                 params=model.parameters())
    dx, dh0 = got.backward(1.0)[0]
    np.testing.assert_allclose(dh0, want["h0"], rtol=1e-6, atol=1e-6)


def test_gru_matches_the_gate_equations_written_out():
    model = nn.GRU(3, 2, seed=7, dtype=np.float64)
    x = RNG.standard_normal((1, 4, 3))
    cell = model.layers[0] if hasattr(model.layers, "__getitem__") else list(model.layers)[0]
    sig = lambda v: 1 / (1 + np.exp(-v))
    h = np.zeros((1, 2))
    for t in range(4):
        gi, gh = x[:, t] @ cell.w_ih + cell.b_ih, h @ cell.w_hh + cell.b_hh
        r, z = sig(gi[:, :2] + gh[:, :2]), sig(gi[:, 2:4] + gh[:, 2:4])
        n = np.tanh(gi[:, 4:] + r * gh[:, 4:])
        h = (1 - z) * n + z * h
    out, final = model(x)
    np.testing.assert_allclose(final[0], h, rtol=1e-12)
    np.testing.assert_allclose(out[:, -1], h, rtol=1e-12)


@pytest.mark.parametrize("masked", [False, True])
def test_losses_match_finite_differences(masked):
    logits = RNG.standard_normal((5, 4))
    labels = np.array([0, 3, 1, 1, 2])
    mask = np.array([1, 0, 1, 1, 0], bool) if masked else None
    f = lambda p: float(nn.cross_entropy(p["z"], labels, mask))
    want = numeric_grads(f, {"z": logits.copy()})["z"]
    got = nn.vjp(lambda p, z: nn.cross_entropy(z, labels, mask), logits, params={}).backward(1.0)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)
    # the value itself, by the definition
    rows = np.flatnonzero(mask) if masked else np.arange(5)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    assert f({"z": logits}) == pytest.approx(-logp[rows, labels[rows]].mean(), rel=1e-12)
    pred, target = RNG.standard_normal((3, 2)), RNG.standard_normal((3, 2))
    got = nn.vjp(lambda p, a: nn.mse_loss(a, target), pred, params={}).backward(1.0)[0]
    np.testing.assert_allclose(got, 2 * (pred - target) / 6, rtol=1e-12)


def test_cross_entropy_with_nothing_selected_is_zero_with_zero_gradient():
    logits = RNG.standard_normal((3, 4))
    rec = nn.vjp(lambda p, z: nn.cross_entropy(z, np.zeros(3, int), np.zeros(3, bool)), logits, params={})
    assert float(rec.output) == 0.0
    np.testing.assert_array_equal(rec.backward(1.0)[0], 0.0)


def _hand_mlp(params, x, y):
    """Forward and backward of Linear-ReLU-Linear-MSE written out in numpy."""
    w1, b1, w2, b2 = params["0.weight"], params["0.bias"], params["2.weight"], params["2.bias"]
    h = x @ w1 + b1
    a = np.maximum(h, 0)
    out = a @ w2 + b2
    loss = np.mean((out - y) ** 2)
    dout = 2 * (out - y) / out.size
    dw2, db2 = a.T @ dout, dout.sum(0)
    da = dout @ w2.T
    dh = da * (h > 0)
    return loss, {"0.weight": x.T @ dh, "0.bias": dh.sum(0), "2.weight": dw2, "2.bias": db2}, dh @ w1.T


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 2e-6)])
def test_value_and_grad_of_an_mlp_equals_a_hand_written_backward(dtype, tol):
    model = nn.Sequential(nn.Linear(6, 8, seed=1, dtype=dtype), nn.ReLU(),
                          nn.Linear(8, 3, seed=2, dtype=dtype))
    x = RNG.standard_normal((10, 6)).astype(dtype)
    y = RNG.standard_normal((10, 3)).astype(dtype)
    loss, grads = nn.value_and_grad(lambda m, a, b: nn.mse_loss(m(a), b), model, x, y)
    want_loss, want, want_dx = _hand_mlp(model.parameters(), x, y)
    assert loss == pytest.approx(float(want_loss), rel=tol)
    for k in want:
        assert grads[k].dtype == dtype
        np.testing.assert_allclose(grads[k], want[k], rtol=tol, atol=tol, err_msg=k)
    # forward now, backward later; I then W give exactly B
    rec = nn.vjp(lambda p, a: nn.mse_loss(nn.functional_call(model, p, a), y), x, params=model.parameters())
    dx, dp = rec.backward(1.0)
    np.testing.assert_allclose(dx, want_dx, rtol=tol, atol=tol)
    rec2 = nn.vjp(lambda p, a: nn.mse_loss(nn.functional_call(model, p, a), y), x, params=model.parameters())
    dx2 = rec2.backward_input(1.0)
    dp2 = rec2.backward_weight()
    np.testing.assert_array_equal(dx2, dx)
    for k in dp:
        np.testing.assert_array_equal(dp2[k], dp[k])


def test_vjp_without_input_grads_gives_the_same_weight_grads_and_no_input_grad():
    model = nn.Sequential(nn.Linear(4, 5, seed=2), nn.ReLU(), nn.Linear(5, 3, seed=4))
    x = RNG.standard_normal((6, 4)).astype(np.float32)
    dy = RNG.standard_normal((6, 3)).astype(np.float32)
    full = nn.vjp(model, x)
    data = nn.vjp(model, x, input_grads=False)
    np.testing.assert_array_equal(data.output, full.output)
    (dx, want), (none, got) = full.backward(dy), data.backward(dy)
    assert none is None and dx.shape == x.shape
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    # the zero-bubble halves likewise: I gives nothing for data, W the same weight gradients
    half = nn.vjp(model, x, input_grads=False)
    assert half.backward_input(dy) is None
    for k, v in half.backward_weight().items():
        np.testing.assert_array_equal(v, want[k])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_keeps_the_dtype_and_passes_gradient_only_where_positive(dtype):
    x = np.array([[-1.5, 0.0, 2.0], [3.0, -0.0, -2.0]], dtype)
    rec = nn.vjp(nn.ReLU(), x)
    np.testing.assert_array_equal(rec.output, [[0, 0, 2], [3, 0, 0]])
    dx, _ = rec.backward(np.full(x.shape, 7, dtype))
    np.testing.assert_array_equal(dx, [[0, 0, 7], [7, 0, 0]])  # 0 at the kink, as x·[x > 0] gives
    assert rec.output.dtype == dx.dtype == dtype
