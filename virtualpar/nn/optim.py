"""Optimizers on ``{name: array}`` dicts, with torch's update rules; ``step`` returns new arrays.

- ``SGD(lr, momentum=0, weight_decay=0)`` — torch.optim.SGD (dampening 0, no Nesterov)::

      g ← g + λ·p;   b ← μ·b + g  (b = g on the first step);   p ← p − lr·b

- ``Adam(lr, betas=(β1, β2), eps, weight_decay=0)`` — torch.optim.Adam (L2 added to the gradient)::

      g ← g + λ·p;  m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²
      p ← p − lr · (m / (1−β1^t)) / (√(v / (1−β2^t)) + ε)

- ``AdamW`` — torch.optim.AdamW: decoupled decay ``p ← p·(1 − lr·λ)`` before the Adam step.

Each keeps its state per parameter name and has ``state_dict`` / ``load_state_dict``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from ..errors import UsageError

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "clip_grad_norm", "accumulate"]


class Optimizer:
    """Base of the optimizers: ``lr``, the step count ``t`` and per-parameter ``state``; ``step(params,
    grads)`` returns new arrays via the subclass's ``_update``, and ``state_dict`` / ``load_state_dict`` save
    and restore."""

    def __init__(self, lr: float) -> None:
        if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not lr >= 0:
            raise UsageError(f"{type(self).__name__}: lr must be a number >= 0, got {lr!r}")
        self.lr = float(lr)
        self.t = 0
        self.state: dict[str, dict[str, np.ndarray]] = {}

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """New parameter values after one step (the inputs are not modified)."""
        missing = [k for k in params if k not in grads]
        if missing:
            raise UsageError(f"{type(self).__name__}.step: no gradient for {missing}")
        extra = [k for k in grads if k not in params]
        if extra:  # a misspelt name would leave its parameter untrained
            raise UsageError(f"{type(self).__name__}.step: gradients for {extra}, which are not parameters "
                             f"({sorted(params)})")
        out = {}
        for k, p in params.items():
            p = np.asarray(p)
            g = np.asarray(grads[k], dtype=p.dtype)
            if g.shape != p.shape:  # numpy would broadcast, and the parameter would change shape
                raise UsageError(f"{type(self).__name__}.step: the gradient of {k!r} "
                                 f"has shape {g.shape}, the "
                                 f"parameter {p.shape}")
            kept = {s: v.shape for s, v in self.state.get(k, {}).items() if np.ndim(v)}  # momentum, m, v
            if any(shape != p.shape for shape in kept.values()):  # broadcast just the same: a resized model
                raise UsageError(f"{type(self).__name__}.step: the state kept for "
                                 f"{k!r} has shapes {kept}, the "
                                 f"parameter {p.shape}; a resized parameter needs a fresh optimizer")
            out[k] = (k, p, g)
        self.t += 1
        return {k: self._update(*args) for k, args in out.items()}

    def _update(self, name: str, p: np.ndarray, g: np.ndarray) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {"t": self.t, "lr": self.lr,
                "state": {k: {s: v.copy() for s, v in d.items()} for k, d in self.state.items()}}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.t, self.lr = int(d["t"]), float(d["lr"])
        self.state = {k: {s: np.array(v, copy=True) for s, v in st.items()} for k, st in d["state"].items()}


def _at_least_zero(opt: str, **values: float) -> None:
    for name, v in values.items():
        if not v >= 0:
            raise UsageError(f"{opt}: {name} must be >= 0, got {v!r}")


class SGD(Optimizer):
    """SGD with optional momentum ``μ`` and L2 ``weight_decay`` ``λ`` added to the gradient (torch.optim.SGD,
    dampening 0, no Nesterov)."""

    def __init__(self, lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> None:
        super().__init__(lr)
        _at_least_zero("SGD", momentum=momentum, weight_decay=weight_decay)
        self.momentum, self.weight_decay = float(momentum), float(weight_decay)

    def _update(self, name: str, p: np.ndarray, g: np.ndarray) -> np.ndarray:
        if self.weight_decay:
            g = g + self.weight_decay * p
        if self.momentum:
            st = self.state.setdefault(name, {})
            buf = g.copy() if "momentum" not in st else self.momentum * st["momentum"] + g
            st["momentum"] = buf
            g = buf
        return p - self.lr * g


class Adam(Optimizer):
    """Adam with ``betas`` (β1, β2), ``eps`` and L2 ``weight_decay`` added to the gradient (torch.optim.Adam);
    bias correction counts each parameter's own steps."""

    decoupled = False

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        super().__init__(lr)
        self.beta1, self.beta2 = map(float, betas)
        name = type(self).__name__
        if not (0.0 <= self.beta1 < 1.0 and 0.0 <= self.beta2 < 1.0):
            raise UsageError(f"{name}: betas must lie in [0, 1), got {tuple(betas)!r}")
        _at_least_zero(name, eps=eps, weight_decay=weight_decay)
        self.eps, self.weight_decay = float(eps), float(weight_decay)

    def _update(self, name: str, p: np.ndarray, g: np.ndarray) -> np.ndarray:
        if self.weight_decay and self.decoupled:
            p = p * (1.0 - self.lr * self.weight_decay)
        elif self.weight_decay:
            g = g + self.weight_decay * p
        st = self.state.setdefault(name, {"m": np.zeros_like(p), "v": np.zeros_like(p), "step": np.array(0)})
        # steps of this parameter, as torch counts them: one first stepped later (a layer unfrozen)
        # gets its first step's bias correction, not the optimizer's count of calls (a state saved
        # before steps were counted per parameter has the optimizer's)
        t = st["step"] = np.array(int(st.get("step", self.t - 1)) + 1)
        st["m"] = self.beta1 * st["m"] + (1.0 - self.beta1) * g
        st["v"] = self.beta2 * st["v"] + (1.0 - self.beta2) * g * g
        m_hat = st["m"] / (1.0 - self.beta1 ** int(t))
        v_hat = st["v"] / (1.0 - self.beta2 ** int(t))
        return (p - self.lr * m_hat / (np.sqrt(v_hat) + self.eps)).astype(p.dtype)


class AdamW(Adam):
    """Adam with decoupled weight decay ``p ← p·(1 − lr·λ)`` before the step, ``weight_decay`` 1e-2 by default
    (torch.optim.AdamW)."""

    decoupled = True

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2) -> None:
        super().__init__(lr, betas, eps, weight_decay)


def clip_grad_norm(grads: dict[str, np.ndarray], max_norm: float) -> tuple[dict[str, np.ndarray], float]:
    """Scale every gradient by ``min(1, max_norm / (‖g‖₂ + 1e-6))`` with ‖g‖₂ over all of them
    (torch.nn.utils.clip_grad_norm_); returns ``(clipped, total_norm)``.  A NaN or infinite norm
    makes every gradient NaN, as torch's does: a step taken with it shows, rather than skipping
    the clip."""
    distinct = {id(g): g for g in grads.values()}  # a tied parameter's one array counts once (torch: once)
    total = math.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in distinct.values()))
    scale = min(1.0, max_norm / (total + 1e-6)) if math.isfinite(total) else math.nan
    scaled = {i: (g * scale).astype(g.dtype) for i, g in distinct.items()}
    return {k: scaled[id(g)] for k, g in grads.items()}, total


def accumulate(grads: list[dict[str, np.ndarray]], mode: str = "mean") -> dict[str, np.ndarray]:
    """Combine microbatch gradients: ``"sum"`` adds them, ``"mean"`` divides the sum by their count
    (with equal microbatches and a mean loss, the mean equals the full batch's gradient).  Summed
    in list order, so a fixed order gives the same bits every time."""
    if mode not in ("sum", "mean"):
        raise UsageError(f"accumulate: mode must be 'sum' or 'mean', got {mode!r}")
    if not grads:
        raise UsageError("accumulate: no gradients to combine")
    first = {}  # names sharing one array (a tied parameter) share the sum: added once, counted once
    for k, v in grads[0].items():
        first.setdefault(id(v), k)
    owner = {k: first[id(v)] for k, v in grads[0].items()}
    sums = {k: np.array(grads[0][k], copy=True) for k in set(owner.values())}
    for i, g in enumerate(grads[1:], 1):
        # numpy would broadcast
        if set(g) != set(owner) or any(np.shape(g[k]) != sums[owner[k]].shape for k in owner):
            shapes = lambda d: {k: np.shape(v) for k, v in d.items()}  # noqa: E731
            raise UsageError(f"accumulate: microbatch {i}'s gradients {shapes(g)} do "
                             "not match microbatch 0's "
                             f"{shapes(grads[0])}")
        for k in sums:
            sums[k] += g[k]
    if mode == "mean":
        sums = {k: (v / len(grads)).astype(v.dtype) for k, v in sums.items()}
    return {k: sums[owner[k]] for k in grads[0]}
