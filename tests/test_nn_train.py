"""Optimizers against steps worked by hand, the reference trainer, state dicts and errors."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from virtualpar import UsageError, nn


def test_sgd_plain_momentum_and_weight_decay_by_hand():
    p, g = {"w": np.array([1.0, -2.0])}, {"w": np.array([0.5, 0.5])}
    assert nn.SGD(0.1).step(p, g)["w"].tolist() == pytest.approx([0.95, -2.05])
    opt = nn.SGD(0.1, momentum=0.9, weight_decay=0.01)
    # step 1: g' = g + 0.01 p = [0.51, 0.48]; buf = g'; p1 = p - 0.1 g'
    p1 = opt.step(p, g)["w"]
    assert p1.tolist() == pytest.approx([1 - 0.051, -2 - 0.048])
    # step 2: g'' = g + 0.01 p1; buf = 0.9 [0.51, 0.48] + g''
    g2 = np.array([0.5, 0.5]) + 0.01 * p1
    buf = 0.9 * np.array([0.51, 0.48]) + g2
    assert opt.step({"w": p1}, g)["w"].tolist() == pytest.approx((p1 - 0.1 * buf).tolist())
    assert p["w"].tolist() == [1.0, -2.0]  # inputs untouched


def test_adam_bias_correction_is_exact_on_the_first_steps():
    opt = nn.Adam(lr=0.1, betas=(0.9, 0.99), eps=1e-8)
    p, g = np.array([1.0]), np.array([0.3])
    p1 = opt.step({"w": p}, {"w": g})["w"]
    # t = 1: m̂ = g, v̂ = g², so the step is lr · g / (|g| + eps)
    assert p1[0] == pytest.approx(1.0 - 0.1 * 0.3 / (0.3 + 1e-8), rel=1e-15)
    p2 = opt.step({"w": p1}, {"w": np.array([-0.1])})["w"]
    m = 0.9 * 0.1 * 0.3 + 0.1 * -0.1
    v = 0.99 * 0.01 * 0.09 + 0.01 * 0.01
    m_hat, v_hat = m / (1 - 0.9 ** 2), v / (1 - 0.99 ** 2)
    assert p2[0] == pytest.approx(p1[0] - 0.1 * m_hat / (math.sqrt(v_hat) + 1e-8), rel=1e-15)


def test_adam_l2_versus_adamw_decoupled_decay():
    p, g = {"w": np.array([2.0])}, {"w": np.array([0.0])}
    # Adam: the decay enters the gradient, g' = 0.5·2 = 1, first step moves by lr·1/(1+eps)
    assert nn.Adam(lr=0.1, weight_decay=0.5).step(p, g)["w"][0] == pytest.approx(2.0 - 0.1, rel=1e-7)
    # AdamW: p·(1 − lr·λ) = 2·0.95 = 1.9, then the Adam step of a zero gradient moves nothing
    assert nn.AdamW(lr=0.1, weight_decay=0.5).step(p, g)["w"][0] == pytest.approx(1.9, rel=1e-12)


def test_optimizer_state_dict_round_trip_continues_identically():
    a = nn.Adam(lr=0.05)
    p, g = {"w": np.ones(3)}, {"w": np.array([0.1, -0.2, 0.3])}
    p = a.step(p, g)
    b = nn.Adam(lr=0.05)
    b.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(a.step(p, g)["w"], b.step(p, g)["w"])


def test_clip_grad_norm_and_accumulate():
    grads = {"a": np.array([3.0]), "b": np.array([4.0])}
    clipped, norm = nn.clip_grad_norm(grads, 1.0)
    assert norm == 5.0
    assert clipped["a"][0] == pytest.approx(0.6, rel=1e-6) and clipped["b"][0] == pytest.approx(0.8, rel=1e-6)
    assert nn.clip_grad_norm(grads, 10.0)[0]["a"][0] == 3.0
    parts = [{"w": np.array([1.0])}, {"w": np.array([3.0])}]
    assert nn.accumulate(parts, "sum")["w"][0] == 4.0 and nn.accumulate(parts, "mean")["w"][0] == 2.0


def _mlp(dtype=np.float64):
    return nn.Sequential(nn.Linear(4, 16, seed=1, dtype=dtype), nn.ReLU(),
                         nn.Linear(16, 2, seed=2, dtype=dtype))


def test_reference_train_learns_and_microbatch_means_equal_the_full_batch():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 4))
    y = np.stack([x[:, 0] * 2 - x[:, 1], x[:, 2] * x[:, 3]], axis=1)
    losses, final = nn.reference_train(_mlp(), [(x, y)], nn.mse_loss, nn.SGD(0.05), steps=60)
    assert losses[-1] < 0.5 * losses[0]
    whole = nn.reference_train(_mlp(), [(x, y)], nn.mse_loss, nn.SGD(0.05), steps=3)
    split = nn.reference_train(_mlp(), [(x, y)], nn.mse_loss, nn.SGD(0.05), steps=3, microbatches=4)
    np.testing.assert_allclose(whole[0], split[0], rtol=1e-12)
    for k in whole[1]:
        np.testing.assert_allclose(whole[1][k], split[1][k], rtol=1e-12)


def test_initialisation_is_deterministic_and_follows_the_dtype():
    a, b = _mlp(np.float32), _mlp(np.float32)
    for k, v in a.state_dict().items():
        assert v.dtype == np.float32
        np.testing.assert_array_equal(v, b.state_dict()[k])
    assert nn.Linear(4, 4, seed=1).weight.tolist() != nn.Linear(4, 4, seed=2).weight.tolist()
    assert _mlp().astype(np.float32).dtype == np.float32


def test_errors_name_the_layer_and_the_shapes():
    lin = nn.Linear(4, 3)
    with pytest.raises(nn.ShapeError,
                       match=r"Linear\(in_features=4.*shape \(\.\.\., 4\), got shape \(2, 5\)"):
        lin(np.ones((2, 5), np.float32))
    with pytest.raises(nn.ShapeError, match="dtype float32.*got float64"):
        lin(np.ones((2, 4)))
    with pytest.raises(UsageError, match=r"missing keys \['2.bias'\]"):
        m = _mlp()
        state = m.state_dict()
        del state["2.bias"]
        m.load_state_dict(state)
    with pytest.raises(UsageError, match=r"wrong shapes 0.weight: expected \(4, 16\), got \(4, 15\)"):
        m = _mlp()
        m.load_state_dict(dict(m.state_dict(), **{"0.weight": np.zeros((4, 15))}))
    with pytest.raises(UsageError, match="unexpected keys"):
        m = _mlp()
        m.load_state_dict(dict(m.state_dict(), extra=np.zeros(1)))
    with pytest.raises(nn.ShapeError, match=r"GRU\(3, 4.*h0 of shape \(1, 2, 4\)"):
        nn.GRU(3, 4)(np.ones((2, 5, 3), np.float32), np.zeros((1, 3, 4), np.float32))


@pytest.mark.parametrize("make, said", [
    # numpy's "negative dimensions"
    (lambda: nn.Linear(-1, 3), "Linear: in_features must be an int >= 1, got -1"),
    (lambda: nn.Linear(4, 2.5), "Linear: out_features must be an int >= 1, got 2.5"),  # silently became 2
    (lambda: nn.Embedding(0, 3), "Embedding: num_embeddings must be an int >= 1"),
    (lambda: nn.LayerNorm(True), "LayerNorm: normalized_shape must be an int >= 1, got True"),
    (lambda: nn.GRU(3, 0), "GRU: hidden_size must be an int >= 1, got 0"),
    (lambda: nn.RNN(3, 4, num_layers=1.5), "RNN: num_layers must be an int >= 1, got 1.5"),
])
def test_layer_sizes_are_checked_where_the_layer_is_made(make, said):
    with pytest.raises(UsageError, match=re.escape(said)):
        make()
    # numpy integers are sizes (0 is refused: issue 43)
    assert nn.Linear(np.int64(4), 1).weight.shape == (4, 1)


class Doubler(nn.Module):
    """A user's module: only forward, no backward."""

    def __init__(self):
        self.scale = np.array([2.0])
        self.inner = nn.Linear(3, 3, seed=4, dtype=np.float64)

    def forward(self, x):
        return self.inner(x) * self.scale


def test_a_user_module_gets_its_backward_for_free():
    m = Doubler()
    assert list(m.state_dict()) == ["scale", "inner.weight", "inner.bias"]
    x = np.random.default_rng(3).standard_normal((4, 3))
    loss, grads = nn.value_and_grad(lambda mod, a: (mod(a) ** 2).sum(), m, x)
    y = m.inner(x)
    assert grads["scale"][0] == pytest.approx(float(np.sum(2 * (2 * y) * y)), rel=1e-12)
    np.testing.assert_allclose(grads["inner.bias"], (2 * (2 * y) * 2).sum(0), rtol=1e-12)


@pytest.mark.parametrize("make", [
    lambda: nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 2, seed=1), nn.Tanh()),
    lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2, seed=1)),
], ids=["gelu-layernorm-tanh", "relu"])
def test_float32_models_keep_float32_gradients(make):
    model = make()
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    y = np.zeros((5, 2), np.float32)
    _, grads = nn.value_and_grad(lambda m, a, b: nn.mse_loss(m(a), b), model, x, y)
    assert {g.dtype for g in grads.values()} == {np.dtype(np.float32)}
    rec = nn.vjp(model, x)
    dx, dp = rec.backward(np.ones((5, 2), np.float32))
    assert dx.dtype == np.float32 and {g.dtype for g in dp.values()} == {np.dtype(np.float32)}


class _Scaled(nn.Module):
    def __init__(self):
        self.s, self.unused = np.array(2.0), np.array(3.0)

    def forward(self, x):
        return x * self.s


def test_an_unused_scalar_parameter_gets_a_zero_gradient_not_nan():
    """autograd's None became np.asarray(None, float64): NaN, which any optimizer step spread."""
    _, grads = nn.value_and_grad(lambda m, a: nn.mse_loss(m(a), np.zeros(3)), _Scaled(), np.ones(3))
    assert grads == {"s": 4.0, "unused": 0.0} and grads["unused"].dtype == np.float64


def test_adam_counts_steps_per_parameter_as_torch_does():
    """A parameter first stepped at the optimizer's 4th call got the 4th step's bias correction:
    -0.058 where torch's first Adam step moves by lr (m̂/√v̂ = g/|g|)."""
    opt = nn.Adam(0.1)
    for _ in range(3):
        opt.step({"a": np.zeros(1)}, {"a": np.ones(1)})
    got = opt.step({"a": np.zeros(1), "new": np.zeros(1)}, {"a": np.ones(1), "new": np.full(1, 5.0)})
    np.testing.assert_allclose(got["new"], [-0.1], rtol=1e-7)  # eps 1e-8 against |g| = 5
    resumed = nn.Adam(0.1)
    resumed.load_state_dict(opt.state_dict())
    np.testing.assert_array_equal(resumed.step({"a": np.zeros(1)}, {"a": np.ones(1)})["a"],
                                  opt.step({"a": np.zeros(1)}, {"a": np.ones(1)})["a"])


@pytest.mark.parametrize("make, said", [
    (lambda: nn.SGD(0.1).step({"b": np.zeros(4)}, {"b": np.ones((3, 4))}),
     r"gradient of 'b' has shape \(3, 4\)"),
    (lambda: nn.Adam(0.1).step({"w": np.zeros((3, 4))}, {"w": np.ones(4)}), r"the parameter \(3, 4\)"),
    (lambda: nn.accumulate([{"w": np.ones((2, 3))}, {"w": np.ones(3)}]), "microbatch 1's gradients"),
    # was KeyError
    (lambda: nn.accumulate([{"w": np.ones(3)}, {"v": np.ones(3)}]), "do not match microbatch 0's"),
    (lambda: nn.SGD(0.1, momentum=-1), "momentum must be >= 0"),
    (lambda: nn.AdamW(betas=(1.5, 0.9)), r"betas must lie in \[0, 1\)"),
    (lambda: nn.Adam(eps=-1), "eps must be >= 0"),
])
def test_optimizers_refuse_what_torch_refuses(make, said):
    """A (3, 4) gradient turned a (4,) parameter into a (3, 4) one: numpy broadcast it."""
    with pytest.raises(UsageError, match=said):
        make()


def test_dtype_errors_say_what_fixes_them():
    with pytest.raises(nn.ShapeError, match="got int64; cast the input to float32$"):  # not ".astype(int64)"
        nn.Linear(4, 3)(np.ones((2, 4), int))
    # float64 states came out
    with pytest.raises(nn.ShapeError, match="expected h0 of dtype float32.*got float64"):
        nn.GRU(3, 4)(np.ones((2, 5, 3), np.float32), np.zeros((1, 2, 4)))


def test_a_masked_rows_label_may_be_a_placeholder():
    """torch-style -100 under the mask was refused as a label outside 0..C-1."""
    logits = np.random.default_rng(0).standard_normal((4, 3))
    mask = np.array([1, 1, 0, 1], bool)
    want = float(np.mean([-(logits[i, c] - np.log(np.exp(logits[i]).sum())) for i,
                          c in ((0, 0), (1, 2), (3, 1))]))
    assert nn.cross_entropy(logits, np.array([0, 2, -100, 1]), mask=mask) == pytest.approx(want, rel=1e-12)
    with pytest.raises(UsageError, match=r"labels must lie in 0..2, got -100..2"):
        nn.cross_entropy(logits, np.array([0, 2, -100, 1]))  # unmasked, it is read
