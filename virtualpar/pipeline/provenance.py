"""Provenance for tracing a model's forward (:mod:`.trace`): arrays that carry the set of recorded
calls, parameters and inputs they were computed from, through every numpy operation of the glue
code between calls.  ``tag(x, deps)`` marks a value, ``deps_of(values)`` reads the union back from
any nesting of lists, tuples and dicts.  A value that leaves numpy (``float(x)``, a Python scalar)
loses its provenance."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["deps_of", "tag"]


class _Tagged(np.ndarray):
    """An array that carries ``deps``: the recorded calls ("call", i) and parameters ("param", name)
    it was computed from."""

    deps: frozenset = frozenset()

    def __array_finalize__(self, obj: Any) -> None:
        self.deps = getattr(obj, "deps", frozenset())

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        deps = deps_of(inputs) | deps_of(tuple(kwargs.get("out", ()) or ()))
        plain = tuple(np.asarray(x) if isinstance(x, _Tagged) else x for x in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(np.asarray(x) if isinstance(x, _Tagged) else x for x in kwargs["out"])
        return tag(getattr(ufunc, method)(*plain, **kwargs), deps)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        deps = deps_of(args) | deps_of(tuple(kwargs.values()))
        return tag(func(*_plain(args), **_plain(kwargs)), deps)


def _plain(x: Any) -> Any:
    if isinstance(x, _Tagged):
        return x.view(np.ndarray)
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def deps_of(values: Any) -> frozenset:
    out: set = set()
    stack = list(values) if isinstance(values, (list, tuple)) else [values]
    while stack:
        v = stack.pop()
        if isinstance(v, _Tagged):
            out |= v.deps
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
    return frozenset(out)


def tag(x: Any, deps: frozenset) -> Any:
    if isinstance(x, np.ndarray) and not isinstance(x, _Tagged):
        x = x.view(_Tagged)
    elif isinstance(x, (np.floating, np.integer)):
        x = np.asarray(x).view(_Tagged)
    elif isinstance(x, (tuple, list)):  # np.split gives a list: its pieces carry the deps too
        return type(x)(tag(v, deps) for v in x)
    if isinstance(x, _Tagged):
        x.deps = deps
    return x
