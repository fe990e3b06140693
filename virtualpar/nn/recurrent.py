"""Recurrent layers, batch-first: ``x`` (N, L, H_in) → ``(outputs (N, L, H), final states (layers, N, H))``.

``RNN``:  h_t = tanh(x_t W_ih + b_ih + h_{t−1} W_hh + b_hh).

``GRU`` (Cho et al. 2014, the gate order and equations of ``torch.nn.GRU``)::

    r_t = σ(x_t W_ir + b_ir + h_{t−1} W_hr + b_hr)            reset gate
    z_t = σ(x_t W_iz + b_iz + h_{t−1} W_hz + b_hz)            update gate
    n_t = tanh(x_t W_in + b_in + r_t ⊙ (h_{t−1} W_hn + b_hn))  new gate
    h_t = (1 − z_t) ⊙ n_t + z_t ⊙ h_{t−1}

with the three input maps stacked in ``w_ih`` (H_in, 3H) as [r | z | n] and likewise ``w_hh``
(H, 3H).  Layer k > 0 reads layer k−1's outputs.  Cost per step and layer: 2·N·3H·(H_in + H) FLOPs
forward.  Initial states default to zeros; pass ``h0`` (layers, N, H) to continue a sequence —
which is how timeline parallelism hands a state from one time segment to the next.
"""

from __future__ import annotations

from typing import Any

import autograd.numpy as anp
import numpy as np

from ..kernels import matmul_flops
from .activations import tanh
from .init import check_dtype, check_size, uniform
from .module import Module, ShapeError, check_input

__all__ = ["RNN", "GRU"]


def _sigmoid(x: Any) -> Any:
    return 0.5 * (tanh(0.5 * x) + 1.0)  # = 1/(1+e^−x), without overflow for large |x|


class _Cell(Module):
    """One layer's weights: ``w_ih`` (in, G·H), ``w_hh`` (H, G·H), biases (G·H,)."""

    def __init__(
        self, input_size: int, hidden_size: int, gates: int, rng: np.random.Generator, dt: np.dtype
    ) -> None:
        self.w_ih = uniform(rng, (input_size, gates * hidden_size), hidden_size, dt)
        self.w_hh = uniform(rng, (hidden_size, gates * hidden_size), hidden_size, dt)
        self.b_ih = uniform(rng, (gates * hidden_size,), hidden_size, dt)
        self.b_hh = uniform(rng, (gates * hidden_size,), hidden_size, dt)


class _Recurrent(Module):
    GATES = 1

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, seed: int = 0,
                 dtype: Any = np.float32) -> None:
        dt = check_dtype(type(self).__name__, dtype)
        name = type(self).__name__
        self.input_size = check_size(name, "input_size", input_size, least=1)
        self.hidden_size = check_size(name, "hidden_size", hidden_size, least=1)
        self.num_layers = check_size(name, "num_layers", num_layers, least=1)
        rng = np.random.default_rng(seed)
        self.layers = _Layers()
        for k in range(num_layers):
            setattr(
                self.layers,
                str(k),
                _Cell(input_size if k == 0 else hidden_size, hidden_size, self.GATES, rng, dt),
            )

    def forward(self, x: Any, h0: Any = None) -> tuple[Any, Any]:
        check_input(self, x, self.input_size)
        if np.ndim(x) != 3:
            raise ShapeError(
                f"{self!r}: expected x of shape (N, L, {self.input_size}) (batch first), got {np.shape(x)}"
            )
        n, length = np.shape(x)[0], np.shape(x)[1]
        want = (self.num_layers, n, self.hidden_size)
        if h0 is not None and tuple(np.shape(h0)) != want:
            raise ShapeError(
                f"{self!r}: expected h0 of shape {want} (layers, N, hidden), got {tuple(np.shape(h0))}"
            )
        if h0 is not None:  # a float64 h0 made a float32 model's outputs and states float64
            check_input(self, h0, self.hidden_size, what="h0")
        finals = []
        seq = [x[:, t, :] for t in range(length)]
        for k, cell in enumerate(self.layers):
            h = anp.zeros((n, self.hidden_size), dtype=self.dtype) if h0 is None else h0[k]
            outs = []
            for xt in seq:
                h = self._step(cell, xt, h)
                outs.append(h)
            seq = outs
            finals.append(h)
        outputs = anp.stack(seq, axis=1) if seq else anp.zeros((n, 0, self.hidden_size), dtype=self.dtype)
        return outputs, anp.stack(finals, axis=0)

    def step_flops(self, batch: int) -> float:
        """Forward FLOPs of one time step through every layer for ``batch`` rows."""
        g, hid = self.GATES, self.hidden_size
        return sum(float(matmul_flops(batch, (self.input_size if k == 0 else hid) + hid, g * hid))
                   for k in range(self.num_layers))

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}"


class _Layers(Module):
    def __iter__(self):
        return (m for _, m in self.named_children())


class RNN(_Recurrent):
    """Elman RNN with tanh: h_t = tanh(x_t W_ih + b_ih + h_{t−1} W_hh + b_hh)."""

    GATES = 1

    def _step(self, cell: _Cell, xt: Any, h: Any) -> Any:
        return tanh(anp.dot(xt, cell.w_ih) + cell.b_ih + anp.dot(h, cell.w_hh) + cell.b_hh)


class GRU(_Recurrent):
    """Gated recurrent unit; the equations are in the module docstring."""

    GATES = 3

    def _step(self, cell: _Cell, xt: Any, h: Any) -> Any:
        hid = self.hidden_size
        gi = anp.dot(xt, cell.w_ih) + cell.b_ih
        gh = anp.dot(h, cell.w_hh) + cell.b_hh
        r = _sigmoid(gi[:, :hid] + gh[:, :hid])
        z = _sigmoid(gi[:, hid:2 * hid] + gh[:, hid:2 * hid])
        new = tanh(gi[:, 2 * hid:] + r * gh[:, 2 * hid:])
        return (1.0 - z) * new + z * h
