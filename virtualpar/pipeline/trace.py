"""Trace a model's submodule calls once, and cut it into pipeline stages at named calls.

As NeuronX Distributed partitions with torch.fx: a model with its own ``forward`` (a GPT whose
blocks live in a list, any ``nn.Module``) is run once on example inputs while every call of one
of its submodules is recorded, outermost calls only, in order (``tok_emb``, ``pos_emb``,
``blocks.0``, …, ``head``).  Values are followed by provenance: every array carries the set of
recorded calls (and parameters) it was computed from, through the glue code between calls.

A cut at call c (``cuts=["blocks.2"]``) makes c the first call of a stage.  The stage before it
hands on exactly one value: the first array argument of call c.  A cut is refused, naming the
modules, when the trace cannot separate the stages there:

- a value computed before the cut reaches a call after it other than as that boundary value
  (a skip connection over the cut);
- a submodule is called on both sides, or a parameter is read on both sides (tied weights);
- a later stage reads the model's inputs (only the first stage receives the batch).

A stage is run by *replaying* the forward (:func:`replay`): calls before the stage return zeros
of their recorded shape, the stage's first call takes the received value as its first argument,
and the replay stops when the next stage's first call is entered, handing on its first argument.
A later stage replays on placeholder inputs (zeros of the inputs' shape and dtype): its glue code
may read their shapes, never their values.  The validation above is what makes this exact:
nothing the stage computes depends on a stub.  Provenance follows numpy's operations; a value
passed through ``np.asarray`` or Python scalars loses it, so the refusals are as good as the
trace can see (a model's own forward that reads its inputs' values after a cut, through such a
conversion, is not caught).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from .. import nn
from ..errors import UsageError
from .provenance import deps_of, tag

__all__ = ["Call", "Trace", "trace_calls", "replay", "check_cuts", "placeholders"]


@dataclass(frozen=True)
class Call:
    """One recorded call: its ``index``, the module's dotted ``name``, what its first array argument
    (``entry``) and its other arguments (``others``) were computed from, the parameters it read,
    and its output's shape and dtype (for the replay's stubs)."""

    index: int
    name: str
    has_entry: bool  # a float array argument that can be a stage's boundary value
    entry: frozenset
    others: frozenset
    params: frozenset
    out_shape: tuple
    out_dtype: str


@dataclass(frozen=True)
class Trace:
    """The calls in order, and what the model's output was computed from."""

    calls: tuple[Call, ...]
    output: frozenset

    def names(self) -> list[str]:
        return [c.name for c in self.calls]

    def index(self, name: str) -> int:
        names = self.names()
        if name not in names:
            raise UsageError(f"no call {name!r} in the traced model; the recorded calls are {names}")
        if names.count(name) > 1:
            raise UsageError(f"{name!r} is called {names.count(name)} times in the forward; a cut must name "
                             f"a call that happens once")
        return names.index(name)


def _module_names(model: nn.Module) -> dict[int, str]:
    names: dict[int, str] = {}
    stack = [("", model)]
    while stack:
        prefix, mod = stack.pop()
        for name, child in mod.named_children():
            full = prefix + name
            if id(child) not in names and child is not model:
                names[id(child)] = full
                stack.append((full + ".", child))
    return names


@contextmanager
def _intercept(handler: Any) -> Iterator[None]:
    """Route every ``Module.__call__`` through ``handler(module, original, args, kwargs)`` for the
    duration (class-level: the driver and a device each run one forward at a time)."""
    original = nn.Module.__call__

    def call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return handler(self, original, args, kwargs)
    nn.Module.__call__ = call  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.__call__ = original  # type: ignore[method-assign]


def _first_array(args: Sequence[Any]) -> int | None:
    for i, a in enumerate(args):
        if isinstance(a, np.ndarray) and a.dtype.kind == "f" or hasattr(a, "_value"):
            return i
    return None


def trace_calls(model: nn.Module, *inputs: Any) -> Trace:
    """Run ``model(*inputs)`` once and record its submodules' outermost calls (see the module doc)."""
    names = _module_names(model)
    calls: list[Call] = []
    depth = [0]

    def handler(mod: nn.Module, original: Any, args: tuple, kwargs: dict) -> Any:
        if depth[0] or id(mod) not in names:
            return original(mod, *args, **kwargs)
        depth[0] += 1
        try:
            out = original(mod, *args, **kwargs)
        finally:
            depth[0] -= 1
        first = _first_array(args)
        entry = deps_of(args[first]) if first is not None else frozenset()
        rest = tuple(a for i, a in enumerate(args) if i != first) + tuple(kwargs.values())
        others = deps_of(rest)
        inside = deps_of(out) - entry - others
        # the module's own parameters always count as read by its call, even where numpy lost the
        # provenance of a value (np.asarray drops the tag)
        own = {k for k in tagged if k.startswith(names[id(mod)] + ".")}
        params = frozenset(n for kind, n in inside if kind == "param") | own
        if not isinstance(out, np.ndarray):
            raise UsageError(f"trace: {names[id(mod)]} returned a {type(out).__name__}; a traced call must "
                             f"return one array")
        index = len(calls)
        calls.append(Call(index, names[id(mod)], first is not None, entry, others, params, tuple(out.shape),
                          str(out.dtype)))
        return tag(np.asarray(out).copy(), frozenset({("call", index)}))

    tagged = {k: tag(np.array(v, copy=True), frozenset({("param", k)}))
              for k, v in model.parameters().items()}
    with model._bound(tagged), _intercept(handler):
        out = model(*(tag(np.array(x, copy=True), frozenset({("input", i)})) if isinstance(x, np.ndarray)
                      else x for i, x in enumerate(inputs)))
    return Trace(tuple(calls), deps_of(out))


def replay(model: nn.Module, trace: Trace, start: int, stop: int, inputs: tuple, received: Any) -> Any:
    """Run calls ``start … stop−1`` of ``model``'s forward (see the module doc): earlier calls are
    stubbed with zeros, call ``start`` takes ``received`` (unless it is 0), and the replay ends at the
    entry of call ``stop`` with its first array argument (or, if ``stop`` is past the last call,
    with the model's output)."""
    names = _module_names(model)
    count = [0]
    depth = [0]

    class _Stop(Exception):
        def __init__(self, value: Any) -> None:
            self.value = value

    def handler(mod: nn.Module, original: Any, args: tuple, kwargs: dict) -> Any:
        if depth[0] or id(mod) not in names:
            return original(mod, *args, **kwargs)
        i = count[0]
        count[0] += 1
        call = trace.calls[i]
        if i == stop:
            raise _Stop(args[_first_array(args)])
        if i < start:
            return np.zeros(call.out_shape, call.out_dtype)
        if i == start and start > 0:
            first = _first_array(args)
            args = args[:first] + (received,) + args[first + 1:]
        depth[0] += 1
        try:
            return original(mod, *args, **kwargs)
        finally:
            depth[0] -= 1

    with _intercept(handler):
        try:
            return model(*inputs)
        except _Stop as stop_here:
            return stop_here.value


def placeholders(example: tuple, rows: int) -> tuple:
    """Zeros shaped as the example inputs with ``rows`` rows: a later stage's inputs for the replay."""
    return tuple(np.zeros((rows, *np.shape(x)[1:]), np.asarray(x).dtype) if isinstance(x, np.ndarray) else x
                 for x in example)


def check_cuts(trace: Trace, starts: Sequence[int]) -> dict[str, int]:
    """Refuse cuts the trace cannot separate (see the module doc); ``starts``: the first call of each
    stage, beginning with 0.  Returns {parameter name: the stage that reads it}."""
    calls = trace.calls
    bounds = list(starts) + [len(calls)]
    stage_of = [s for s in range(len(starts)) for _ in range(bounds[s], bounds[s + 1])]
    name = {c.index: c.name for c in calls}
    owner: dict[str, int] = {}
    reader: dict[str, str] = {}
    called: dict[str, int] = {}

    def read(param: str, stage: int, by: str) -> None:
        if owner.setdefault(param, stage) != stage:
            raise UsageError(f"cannot cut here: parameter {param!r} is read by {reader[param]} (stage "
                             f"{owner[param]}) and by {by} (stage {stage}); tied weights must stay in one "
                             f"stage")
        reader.setdefault(param, by)

    def needs(deps: frozenset, stage: int, by: str, what: str) -> None:
        for kind, ref in sorted(deps, key=str):
            if kind == "param":
                read(ref, stage, by)
            elif kind == "input":
                if stage:
                    raise UsageError(f"cannot cut here: {by} (stage {stage}) reads {what} computed from the "
                                     f"model's input {ref}, which only the first stage receives")
            elif stage_of[ref] != stage:
                raise UsageError(f"cannot cut here: {by} (stage {stage}) reads {what} computed from "
                                 f"{name[ref]} (stage {stage_of[ref]}) other than through the stage boundary "
                                 f"(a value skipping over the cut)")

    for c in calls:
        s = stage_of[c.index]
        if called.setdefault(c.name, s) != s:
            raise UsageError(f"cannot cut here: {c.name} is called in stage {called[c.name]} and in stage "
                             f"{s}")
        if c.index == bounds[s] and s > 0:
            if not c.has_entry:
                raise UsageError(f"cannot cut at {c.name!r}: it takes no float array to receive from the "
                                 f"previous stage")
            needs(c.entry, s - 1, f"the boundary into {c.name}", "a value")
        else:
            needs(c.entry, s, c.name, "its input")
        needs(c.others, s, c.name, "an argument")
        for p in c.params:
            read(p, s, c.name)
    needs(trace.output, len(starts) - 1, "the model's output", "a value")
    return owner
