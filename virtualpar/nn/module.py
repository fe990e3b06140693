"""``Module``: a tree of modules holding named numpy parameters.

A module's parameters are its attributes that hold numpy arrays, except those whose name starts
with ``_`` (constants such as a mask: torch's non-persistent buffers); its children are its
attributes that hold modules, whatever their name.  Both are found by name in the order they were
set, so ``state_dict()`` keys are dotted paths such as ``"0.weight"`` (``Sequential``) or
``"gru.layers.1.w_ih"``.  A module reachable under several names (tied weights) holds one
parameter under each: ``state_dict()`` lists every name, gradients give each name the whole
gradient, and ``num_parameters()`` counts it once.  A subclass writes only ``forward``;
:func:`virtualpar.nn.functional_call` runs it with other parameter values bound in place (autograd boxes, when
differentiating), which is how every layer gets its backward for free.
"""

from __future__ import annotations

from contextlib import contextmanager
from reprlib import recursive_repr
from typing import Any, Iterator

import numpy as np

from ..errors import UsageError

__all__ = ["Module", "ShapeError"]

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class ShapeError(UsageError, ValueError):
    """A layer got an input of the wrong shape or dtype (the message names the layer and both)."""


class _ParameterDtype:
    """``module.dtype``: its first parameter's dtype (None without parameters).  A non-data
    descriptor, so a subclass may still set ``self.dtype`` itself, as the built-in layers' argument
    suggests."""

    def __get__(self, module: Any, owner: type) -> Any:
        if module is None:
            return self
        for _, value in module.named_parameters():
            return np.dtype(value.dtype)  # arrays and autograd's boxes both carry one
        return None


class Module:
    """Base class: subclass, set parameters (numpy arrays) and submodules as attributes, write ``forward``."""

    def __setattr__(self, name: str, value: Any) -> None:
        order = self.__dict__.setdefault("_order", [])
        if name not in order and (isinstance(value,
                                             Module) or isinstance(value, np.ndarray) and name[:1] != "_"):
            order.append(name)
        object.__setattr__(self, name, value)

    # -- the tree -----------------------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        for name in self.__dict__.get("_order", []):
            value = self.__dict__[name]
            if isinstance(value, Module):
                yield name, value

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
        """``(dotted name, array)`` for every parameter, depth first in the order they were set."""
        for dotted, _, _, value in self._slots(prefix):
            yield dotted, value

    def _slots(self, prefix: str = "", path: tuple = ()) -> Iterator[tuple[str, "Module", str, Any]]:
        """``(dotted name, owning module, attribute, value)`` per parameter, as ``named_parameters``.
        A child that is one of its own ancestors (a back-reference such as ``self._owner``) is not
        walked again; a module used twice elsewhere (tied weights) is, under each name."""
        path = path + (self,)
        for name in self.__dict__.get("_order", []):
            value = self.__dict__[name]
            if isinstance(value, Module):
                if not any(value is p for p in path):
                    yield from value._slots(f"{prefix}{name}.", path)
            elif value is not None:
                yield f"{prefix}{name}", self, name, value

    def state_dict(self) -> dict[str, np.ndarray]:
        """``{dotted name: array}`` (copies: later training does not change the dict)."""
        return {name: np.array(value, copy=True) for name, value in self.named_parameters()}

    def parameters(self) -> dict[str, np.ndarray]:
        """``{dotted name: array}`` without copies (the module's own arrays)."""
        return dict(self.named_parameters())

    def num_parameters(self) -> int:
        """Number of scalars in the parameters, a tied parameter (a module used twice) counted once."""
        return sum(int(np.size(v)) for v in {(id(o), leaf): v for _, o, leaf, v in self._slots()}.values())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Set every parameter from ``state``; names and shapes must match exactly, and every value
        must convert to its parameter's dtype without losing what it means (see :func:`_convert`:
        float64 into float32 rounds, as ``astype`` does; complex into real, or float into int, is refused).

        Raises ``UsageError`` naming the missing, unexpected, mis-shaped and mis-typed entries; nothing
        is set unless everything converts."""
        own = dict(self.named_parameters())
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        wrong = [f"{k}: expected {own[k].shape}, got {np.shape(state[k])}" for k in own
                 if k in state and np.shape(state[k]) != own[k].shape]
        if missing or unexpected or wrong:
            parts = []
            if missing:
                parts.append(f"missing keys {missing}")
            if unexpected:
                parts.append(f"unexpected keys {unexpected}")
            if wrong:
                parts.append("wrong shapes " + "; ".join(wrong))
            raise UsageError(f"{type(self).__name__}.load_state_dict: " + ", ".join(parts))
        owner = type(self).__name__  # every value converted before any is set: all or nothing
        new = {name: _convert(owner, name, value, own[name].dtype) for name, value in state.items()}
        for name, value in new.items():
            self._set(name, value)

    def astype(self, dtype: Any) -> "Module":
        """Cast every parameter to ``dtype`` (float32 or float64) in place; returns self."""
        dtype = np.dtype(dtype)
        if dtype not in FLOAT_DTYPES:
            raise UsageError(f"{type(self).__name__}.astype: parameters are float32 or float64, got {dtype}")
        for name, value in list(self.named_parameters()):
            self._set(name, value.astype(dtype))
        return self

    dtype = _ParameterDtype()

    def _set(self, dotted: str, value: Any) -> None:
        owner, _, leaf = dotted.rpartition(".")
        target = self
        for part in owner.split(".") if owner else []:
            target = target.__dict__[part]
        object.__setattr__(target, leaf, value)

    @contextmanager
    def _bound(self, params: dict[str, Any]):
        """Temporarily replace parameters by ``params`` (any subset of names, values may be boxes).
        Runs at every traced call, so it walks the tree once and sets the attributes directly."""
        slots = {dotted: (owner, leaf, value) for dotted, owner, leaf, value in self._slots()}
        unknown = [k for k in params if k not in slots]
        if unknown:
            raise UsageError(f"{type(self).__name__}: unknown parameter names {unknown}; the "
                             f"module has {list(slots)}")
        try:
            for name, value in params.items():
                owner, leaf, _ = slots[name]
                object.__setattr__(owner, leaf, value)
            yield self
        finally:
            for name in params:
                owner, leaf, old = slots[name]
                object.__setattr__(owner, leaf, old)

    # -- calling ------------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def extra_repr(self) -> str:
        return ""

    @recursive_repr()  # a back-reference (self._owner) prints as "..."
    def __repr__(self) -> str:
        children = list(self.named_children())
        extra = self.extra_repr()
        if extra or not children:  # a layer says what it is; a container lists its children
            return f"{type(self).__name__}({extra})"
        inner = "\n".join(f"  ({n}): " + repr(c).replace("\n", "\n  ") for n, c in children)
        return f"{type(self).__name__}(\n{inner}\n)"


def check_input(layer: Module, x: Any, last_dim: int | None, what: str = "input") -> None:
    """Raise ``ShapeError`` unless ``x`` is a float array (of the layer's dtype) ending in ``last_dim``."""
    if isinstance(x, (tuple, dict)):
        what_it_is = f"a tuple of {len(x)}" if isinstance(x, tuple) else "a dict"
        hint = " (a recurrent layer returns (outputs, h_n): pass on its [0])" if isinstance(x, tuple) else ""
        raise ShapeError(f"{layer!r}: expected an array as {what}, got {what_it_is}{hint}")
    shape = getattr(x, "shape", None)  # arrays and autograd's boxes: np.shape would go through asarray
    dtype = getattr(x, "dtype", None)
    if shape is None:  # a list or a scalar: checked as the array numpy makes of it
        as_array = np.asarray(x)
        shape, dtype = as_array.shape, as_array.dtype
    if last_dim is not None and (len(shape) == 0 or shape[-1] != last_dim):
        raise ShapeError(f"{layer!r}: expected {what} of shape (..., {last_dim}), got shape {tuple(shape)}")
    own = layer.dtype
    if dtype is not None and own is not None and dtype != own and np.dtype(dtype) != own:
        got = np.dtype(dtype)
        fix = f"cast the {what} or call .astype({got}) on the model" if got in (np.float32, np.float64) else \
            f"cast the {what} to {own}"  # a model's parameters are float32 or float64, never int
        raise ShapeError(f"{layer!r}: expected {what} of dtype {own} (the layer's "
                         f"parameters), got {got}; {fix}")


def _convert(owner: str, name: str, value: Any, dtype: np.dtype) -> np.ndarray:
    """``value`` as a fresh ``dtype`` array, if that keeps its meaning.

    The rule: numpy's ``same_kind`` casts (bool -> int -> float -> complex, and narrowing within one
    kind, such as float64 -> float32, which only rounds), except that an integer or bool source into
    a float or complex parameter must convert exactly (int64 2**53 + 1 into float64 would not).
    Refused: complex -> real (drops the imaginary part), float -> int (truncates), anything
    non-numeric.  A lossy cast raises ``UsageError`` naming the key, both dtypes and why."""
    where = f"{owner}.load_state_dict: {name!r}"
    try:
        src = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{where} cannot be made a {dtype} array: {exc}") from None
    if src.dtype.kind not in "biufc":
        raise UsageError(f"{where} cannot be made a {dtype} array: it holds {src.dtype} values, not numbers")
    if not np.can_cast(src.dtype, dtype, casting="same_kind"):
        why = "the imaginary part would be dropped" if src.dtype.kind == "c" else \
            "the fraction would be cut off" if src.dtype.kind == "f" else "the values would change"
        raise UsageError(f"{where} is {src.dtype}, which cannot be made a {dtype} array without loss "
                         f"({why}); convert it yourself (e.g. .real or np.round) if that is what you want")
    out = np.array(src, dtype=dtype, copy=True)
    if src.dtype.kind in "iu" and dtype.kind in "fc":
        with np.errstate(invalid="ignore", over="ignore"):  # a round trip: exact iff it comes back equal
            back = out.real.astype(src.dtype) if np.all(np.isfinite(out)) else None
        if back is None or not np.array_equal(back, src):
            raise UsageError(f"{where} holds {src.dtype} values that {dtype} cannot hold exactly (it has "
                             f"{np.finfo(dtype).nmant + 1} bits of mantissa); convert "
                             "it yourself if rounding "
                             "is meant")
    return out
