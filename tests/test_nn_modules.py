"""The module tree and differentiation at its edges: tied weights, private names, containers as
outputs and as inputs, saturated activations, optimizer state that no longer fits, masks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from virtualpar import nn
from virtualpar.errors import UsageError

from .test_nn_grads import numeric_grads


def test_a_module_used_twice_gets_its_whole_gradient_under_each_name():
    lin = nn.Linear(2, 2, seed=3, dtype=np.float64)
    model = nn.Sequential(lin, nn.Tanh(), lin)
    x, y = np.array([[0.3, -1.2], [0.7, 0.1]]), np.array([[0.5, -0.5], [1.0, 0.0]])
    loss = lambda m: nn.mse_loss(m(x), y)  # noqa: E731
    _, grads = nn.value_and_grad(lambda m: loss(m), model)

    def of(p):  # the shared weight moved as one
        old = lin.weight.copy()
        lin.weight = p["w"]
        value = float(loss(model))
        lin.weight = old
        return value

    want = numeric_grads(of, {"w": lin.weight.copy()})["w"]
    np.testing.assert_allclose(grads["0.weight"], want, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(grads["2.weight"], want, rtol=1e-7, atol=1e-10)
    assert grads["0.weight"] is grads["2.weight"]  # one parameter, one gradient (torch: one .grad)
    assert model.num_parameters() == 6
    clipped, norm = nn.clip_grad_norm(grads, 1e9)  # counted once, as torch's parameters() dedups
    assert norm == pytest.approx(np.sqrt(sum(float((grads[k] ** 2).sum()) for k in ("0.weight", "0.bias"))))
    summed = nn.accumulate([grads, grads], "sum")
    assert summed["0.weight"] is summed["2.weight"] and np.allclose(summed["0.weight"], 2 * grads["0.weight"])
    rec = nn.vjp(model, x)  # the same through vjp
    np.testing.assert_allclose(rec.backward(np.ones((2, 2)))[1]["0.weight"],
                               rec.backward(np.ones((2, 2)))[1]["2.weight"])


def test_private_submodules_are_trained_and_private_arrays_are_constants():
    class Net(nn.Module):
        def __init__(self):
            self._proj = nn.Linear(3, 3, dtype=np.float64)
            self._scale = np.full(3, 2.0)  # a constant: not a parameter
            self.head = nn.Linear(3, 1, seed=1, dtype=np.float64)

        def forward(self, x):
            return self.head(self._proj(x) * self._scale)

    net = Net()
    assert list(net.state_dict()) == ["_proj.weight", "_proj.bias", "head.weight", "head.bias"]
    _, grads = nn.value_and_grad(lambda m: nn.mse_loss(m(np.ones((2, 3))), np.zeros((2, 1))), net)
    assert np.abs(grads["_proj.weight"]).sum() > 0


def test_a_layer_given_a_tuple_or_a_list_says_so_at_that_layer():
    with pytest.raises(nn.ShapeError, match=r"layer 1 of Sequential: Linear.*got a tuple of 2.*\[0\]"):
        nn.Sequential(nn.GRU(3, 4, num_layers=2), nn.Linear(4, 1))(np.ones((2, 2, 3), np.float32))
    with pytest.raises(nn.ShapeError, match="layer 0 of Sequential.*dtype float32.*got float64"):
        nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))([[1.0, 2.0, 3.0]])
    twins = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4), nn.Linear(8, 4))
    with pytest.raises(nn.ShapeError, match="^layer 2 of Sequential"):
        twins(np.ones((1, 4), np.float32))


def test_vjp_of_a_dict_or_ragged_list_output():
    class Heads(nn.Module):
        def __init__(self):
            self.a, self.b = nn.Linear(2, 2, dtype=np.float64), nn.Linear(2, 3, seed=1, dtype=np.float64)

        def forward(self, x):
            return {"a": self.a(x), "b": self.b(x)}

    m, x = Heads(), np.array([[1.0, 2.0]])
    rec = nn.vjp(m, x)
    assert type(rec.output["a"]) is np.ndarray
    dx, grads = rec.backward({"b": np.ones((1, 3)), "a": np.ones((1, 2))})
    np.testing.assert_allclose(grads["a.weight"], x.T @ np.ones((1, 2)))  # y = x W: dW = xᵀ dy
    np.testing.assert_allclose(dx, np.ones((1, 2)) @ m.a.weight.T + np.ones((1, 3)) @ m.b.weight.T)
    with pytest.raises(UsageError, match="same keys"):
        rec.backward({"a": np.ones((1, 2))})
    ragged = nn.vjp(lambda p, x: [x * 2, x[:, :1]], x, params={})
    assert ragged.backward([np.ones((1, 2)), np.ones((1, 1))])[0].tolist() == [[3.0, 2.0]]


@pytest.mark.parametrize("layer, x", [(nn.Tanh(), 50.0), (nn.GELU("tanh"), 12.0), (nn.Tanh(), -400.0)])
def test_saturated_tanh_backward_is_quiet_and_right(layer, x):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dx, _ = nn.vjp(layer, np.full((1, 1), x, np.float32)).backward(np.ones((1, 1), np.float32))
    assert dx.dtype == np.float32 and dx[0, 0] == pytest.approx(1.0 if isinstance(layer, nn.GELU) else 0.0)


def test_optimizer_state_of_another_shape_is_refused():
    sgd = nn.SGD(0.1, momentum=0.9)
    sgd.step({"w": np.ones(4)}, {"w": np.ones(4)})
    with pytest.raises(UsageError, match=r"state kept for 'w' has shapes \{'momentum': \(4,\)\}"):
        sgd.step({"w": np.ones(1)}, {"w": np.ones(1)})
    adam = nn.Adam(0.1)
    adam.step({"w": np.ones((3, 2))}, {"w": np.ones((3, 2))})
    again = nn.Adam(0.1)
    again.load_state_dict(adam.state_dict())
    with pytest.raises(UsageError, match="fresh optimizer"):
        again.step({"w": np.ones((1, 2))}, {"w": np.ones((1, 2))})
    with pytest.raises(UsageError, match="lr must be a number"):
        nn.SGD("0.1")
    # torch allows 0
    assert nn.SGD(0.0).step({"w": np.ones(2)}, {"w": np.ones(2)})["w"].tolist() == [1.0, 1.0]


def test_clip_with_a_nan_gradient_makes_every_gradient_nan():
    clipped, total = nn.clip_grad_norm({"a": np.array([np.nan]), "b": np.ones(2)}, 1.0)
    assert np.isnan(total) and np.isnan(clipped["b"]).all()


def test_cross_entropy_mask_must_be_bool_of_the_labels_shape():
    logits, labels = np.zeros((2, 3, 5)), np.zeros((2, 3), int)
    for bad in (np.ones((3, 2), bool), np.ones(6, bool), [[0.2, 0, 0], [0, 0, 0]]):
        with pytest.raises(UsageError, match=r"mask must be a bool array of the labels' shape \(2, 3\)"):
            nn.cross_entropy(logits, labels, bad)
    with pytest.raises(UsageError, match="class dimension"):
        nn.cross_entropy(np.float64(1.0), np.array(0))


def test_load_state_dict_is_all_or_nothing_and_dtype_may_be_set():
    lin = nn.Linear(2, 2)
    before = lin.state_dict()
    with pytest.raises(UsageError, match="'bias' cannot be made a float32 array"):
        lin.load_state_dict({"weight": np.zeros((2, 2)), "bias": ["x", "y"]})
    np.testing.assert_array_equal(lin.weight, before["weight"])

    class Own(nn.Module):
        def __init__(self, dtype=np.float64):
            self.dtype = np.dtype(dtype)  # as the built-in layers' argument suggests
            self.w = np.ones(2, self.dtype)

    assert Own(np.float32).dtype == np.float32 and nn.Linear(2, 2).dtype == np.float32
    with pytest.raises(UsageError, match="num_layers must be an int >= 1"):
        nn.RNN(4, 3, num_layers=None)


def test_a_back_reference_to_an_ancestor_is_not_walked():
    """With _x submodules registered, self._owner = parent recursed for ever."""
    class Head(nn.Module):
        def __init__(self, owner):
            self.lin = nn.Linear(2, 2)
            self._owner = owner

    class Body(nn.Module):
        def __init__(self):
            self.head = Head(self)

    body = Body()
    assert body.num_parameters() == 6 and list(body.state_dict()) == ["head.lin.weight", "head.lin.bias"]
    assert "(_owner): ..." in repr(body)
