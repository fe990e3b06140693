"""Differentiation: one mechanism for the whole project, reverse mode by ``autograd``.

Layers are functions of (parameters, input) written with ``autograd.numpy``; :func:`functional_call`
binds parameter values (autograd's boxes, when tracing) into a module for one call, so a user who
subclasses ``Module`` and writes only ``forward`` gets the backward for free.

- :func:`value_and_grad` — ``(loss, grads)`` of a scalar loss, grads keyed like ``state_dict()``.
- :func:`vjp` — forward now, backward later: a pipeline stage runs its forward for microbatch m,
  keeps the returned :class:`VJP`, and many microbatches later calls ``backward(dy)`` (B), or
  ``backward_input(dy)`` (I) and ``backward_weight(dy)`` (W) as zero-bubble schedules split it.

Cost: autograd records one node per primitive op (~5–20 µs of Python each) and its backward runs
each op's vjp once; for layers of realistic size the numpy kernels dominate (benchmarks/bench_nn.py).

Why autograd: numpy-native, pure Python (no compiled extension to build), safe under ``fork``,
and ``make_vjp`` is exactly "forward now, backward later".
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from autograd import tuple as ag_tuple

from ..errors import UsageError
from ._autograd import record, unbox
from .module import Module

__all__ = ["functional_call", "value_and_grad", "vjp", "VJP"]


def functional_call(module: Module, params: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    """``module(*args, **kwargs)`` with ``params`` (a subset of ``state_dict()`` names) bound in place."""
    with module._bound(params):
        return module(*args, **kwargs)


def _differentiable(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.kind in "fc" or isinstance(x, float)


def _trace(fun: Callable[..., Any], values: list[Any],
           constant: int = 0) -> tuple[Any, Callable[[Any], list[Any]]]:
    """Run ``fun(*values)`` once, recording it; return ``(output, back)`` where ``back(dy)`` gives
    d<dy, output>/d value for every value.

    Each float value is its own root of the trace (:func:`._autograd.record`, the one module that
    touches autograd's internals, says why), so each gradient flows straight to its root.  Values
    that are not float arrays (integer labels), and the last ``constant`` values, are passed
    through unboxed: no gradient flows to them, and none is computed."""
    free = len(values) - constant
    roots = [i < free and _differentiable(v) for i, v in enumerate(values)]
    out, back = record(fun, values, roots, pack=_packed)
    return _unbox(out), back


def _unbox(x: Any) -> Any:
    if isinstance(x, (tuple, list)):
        return type(x)(_unbox(v) for v in x)
    if isinstance(x, dict):
        return {k: _unbox(v) for k, v in x.items()}
    return unbox(x)


def _packed(out: Any) -> Any:
    """The traced output as one node: a tuple, a list or a dict (its values in key order) of
    arrays goes through autograd's tuple; nested containers are refused (their gradients were
    silently zero)."""
    parts = list(out.values()) if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else None
    if parts is None:
        return out
    if any(isinstance(v, (tuple, list, dict)) for v in parts):
        raise UsageError(f"vjp: the output is a {type(out).__name__} holding a "
                         "container; return arrays, or a "
                         f"tuple, list or dict of arrays")
    return ag_tuple(parts)


def _tied(module: Any, params: dict[str, Any]) -> tuple[list[str], list[int]]:
    """Parameters under several names: ``(distinct names, index into them per name)``.  Names are
    one parameter when they reach the same attribute of the same module (a module used twice, as
    tied embeddings are); each distinct one is traced once, so its gradient is whole.  Two
    attributes that merely hold the same array are two parameters (a step sets each on its own)."""
    slot = {d: (id(o), leaf) for d, o, leaf, _ in module._slots()} if isinstance(module, Module) else {}
    first: dict[Any, int] = {}
    distinct: list[str] = []
    rep: list[int] = []
    for name in params:
        index = first.setdefault(slot.get(name, name), len(distinct))
        if index == len(distinct):
            distinct.append(name)
        rep.append(index)
    return distinct, rep


def value_and_grad(fn: Callable[..., Any], model: Module, *args: Any) -> tuple[float, dict[str, np.ndarray]]:
    """``(loss, grads)`` where ``loss = fn(model, *args)`` is a scalar and ``grads[name]`` is
    d loss / d parameter ``name`` (keys as in ``model.state_dict()``; a tied parameter's whole
    gradient under each of its names)."""
    if not isinstance(model, Module):
        raise UsageError("value_and_grad(fn, model, *args): model must be an nn.Module, got "
                         f"{type(model).__name__}; "
                         "for a plain function use vjp(fn, *inputs, params=...)")
    params = model.parameters()
    names = list(params)
    distinct, rep = _tied(model, params)

    def loss_of(*values: Any) -> Any:
        with model._bound({k: values[r] for k, r in zip(names, rep)}):
            return fn(model, *args)

    loss, back = _trace(loss_of, [params[k] for k in distinct])
    if np.ndim(loss) != 0:
        raise UsageError("value_and_grad: fn must return a scalar loss, got an array "
                         f"of shape {np.shape(loss)}")
    grads = back(np.ones_like(loss))
    dense = [_dense(g, params[k]) for k, g in zip(distinct, grads)]
    return float(loss), {k: dense[r] for k, r in zip(names, rep)}  # a tied parameter: one array, every name


class VJP:
    """A forward that ran, kept for its backward: ``output``, and ``backward(dy)`` later.

    ``backward(dy) -> (dinputs, grads)``: dinputs is one array for one input, else a tuple.
    ``backward_input(dy)`` (zero-bubble "I") and ``backward_weight(dy)`` ("W") give exactly the two
    halves of ``backward``.  With one recorded graph per forward, the reverse pass yields both
    halves at once: ``backward_input`` runs it and keeps the weight gradient, which
    ``backward_weight`` then hands out (so I + W cost one backward here; a modelled clock charges
    each its own declared FLOPs).
    """

    def __init__(self, back: Callable[[Any], Any], output: Any, params: dict[str, np.ndarray], n_inputs: int,
                 inputs: tuple, input_grads: bool = True,
                 tied: tuple[list[str], list[int]] | None = None) -> None:
        self.output = output
        self._back = back
        self._params = params
        self._tied = tied if tied is not None else (list(params), list(range(len(params))))
        self._n = n_inputs
        self._inputs = inputs
        self._input_grads = input_grads
        self._pending: dict[str, np.ndarray] | None = None

    def backward(self, dy: Any) -> tuple[Any, dict[str, np.ndarray]]:
        grads = self._back(_cotangent(dy, self.output))
        distinct, rep = self._tied
        k = len(distinct)
        dense = [_dense(g, self._params[name]) for name, g in zip(distinct, grads)]
        dparams = {name: dense[r] for name, r in zip(self._params, rep)}  # a tied parameter: one array
        if not self._input_grads:
            return (None if self._n == 1 else (None,) * self._n), dparams
        dinputs = tuple(_dense(g, x) for g, x in zip(grads[k:], self._inputs))
        return (dinputs[0] if self._n == 1 else dinputs), dparams

    def backward_input(self, dy: Any) -> Any:
        dinputs, self._pending = self.backward(dy)
        return dinputs

    def backward_weight(self, dy: Any = None) -> dict[str, np.ndarray]:
        if self._pending is None:
            if dy is None:
                raise UsageError("backward_weight needs dy unless backward_input ran first")
            return self.backward(dy)[1]
        grads, self._pending = self._pending, None
        return grads


def vjp(module: Module | Callable[..., Any], *inputs: Any, params: dict[str, Any] | None = None,
        input_grads: bool = True) -> VJP:
    """Run ``module(*inputs)`` now and keep what its backward needs (see :class:`VJP`).

    ``module`` is a ``Module`` (its own parameters, or ``params`` in their place) or a plain
    function ``fn(params, *inputs)`` with an explicit ``params`` dict.  ``input_grads=False``
    treats the inputs as data (a pipeline's first stage): the backward gives ``None`` for them and
    skips their part of the work (for a ``Linear``, the ``dy Wᵀ`` matmul, a third of its backward)."""
    if isinstance(module, Module):
        own = module.parameters() if params is None else dict(params)
    elif params is None:
        raise UsageError("vjp of a plain function needs params=")
    else:
        own = dict(params)
    names = list(own)
    distinct, rep = _tied(module, own)
    k = len(distinct)

    def run(*values: Any) -> Any:
        bound = {n: values[r] for n, r in zip(names, rep)}
        if isinstance(module, Module):
            with module._bound(bound):
                return module(*values[k:])
        return module(bound, *values[k:])

    output, back = _trace(run, [own[n] for n in distinct] + list(inputs),
                          constant=0 if input_grads else len(inputs))
    return VJP(back, output, own, len(inputs), inputs, input_grads, (distinct, rep))


def _cotangent(dy: Any, output: Any) -> Any:
    """``dy`` shaped as the output, for the traced node: a tuple for a tuple or list, for a dict
    its values in the output's key order."""
    if isinstance(output, dict):
        if not isinstance(dy, dict) or set(dy) != set(output):
            raise UsageError(f"backward: the output is a dict with keys {list(output)}; dy must be a "
                             "dict with the same keys")
        return tuple(_cotangent(dy[k], o) for k, o in output.items())
    if isinstance(output, (tuple, list)):
        if not isinstance(dy, (tuple, list)) or len(dy) != len(output):
            raise UsageError(f"backward: the output is a {type(output).__name__} of "
                             f"{len(output)}; dy must be a tuple "
                             f"or list of as many")
        return tuple(_cotangent(d, o) for d, o in zip(dy, output))
    if dy is None:
        return np.zeros_like(output)
    if np.shape(dy) != np.shape(output):
        raise UsageError(f"backward: dy has shape {np.shape(dy)}, the output {np.shape(output)}")
    return np.asarray(dy, dtype=np.asarray(output).dtype)


def _dense(g: Any, like: Any) -> np.ndarray:
    """autograd gives 0 (a float) or None for inputs the output does not depend on: make it an
    array of zeros (None as a 0-d float64 array was NaN: an unused scalar parameter's gradient)."""
    if g is None or (np.ndim(g) == 0 and np.ndim(like) != 0):
        return np.zeros(np.shape(like), dtype=getattr(like, "dtype", np.float64))
    return np.asarray(g, dtype=getattr(like, "dtype", None))
