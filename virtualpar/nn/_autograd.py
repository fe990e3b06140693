"""The one place that touches autograd's internals: a trace with many roots, and unboxing.

autograd's public ``make_vjp(fun, x)`` differentiates one argument.  A model has many parameters;
packed into one tuple or dict they go through autograd's container vspaces, where every parameter
read is a ``container_take`` node whose backward adds a sparse container into a zero container of
*every* parameter (2.7x a hand-written backward on a 4-layer MLP, measured when ``functional`` was
written).  :func:`record` instead makes each float value its own root of one trace, so each
gradient flows straight to its root in one reverse pass.

What is relied on from autograd (each pinned by a named test in ``tests/test_nn_autograd_adapter.py``,
so an autograd release that changes it fails there first, not deep inside a training run):

- ``autograd.tracer.trace_stack.new_trace()`` opens a trace; ``new_box(value, trace, node)`` boxes a
  value on it; ``isbox(x)`` and ``x._trace`` / ``x._node`` tell whether, and where, an output was
  traced; ``getval(x)`` unboxes (nested boxes too).
- ``autograd.core.VJPNode.new_root()`` makes a root node; a node's ``parents`` and ``vjp(g)`` (one
  gradient per parent) walk the graph backward; ``autograd.util.toposort(end)`` orders it, the end
  first; ``autograd.core.add_outgrads`` sums two gradients of one node, sparse ones (from indexing)
  included, and its result is ``(gradient, mutable)``.

Everything else in ``nn`` uses only the public API: ``autograd.numpy``, ``autograd.extend``'s
``primitive`` / ``defvjp`` / ``notrace_primitive``, and ``autograd.tuple``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from autograd.core import VJPNode, add_outgrads
from autograd.tracer import getval, isbox, new_box, trace_stack
from autograd.util import toposort

__all__ = ["record", "unbox"]


def unbox(x: Any) -> Any:
    """The plain value under ``x`` (``x`` itself when it is not traced)."""
    return getval(x)


def record(fun: Callable[..., Any], values: Sequence[Any], roots: Sequence[bool],
           pack: Callable[[Any], Any] = lambda out: out) -> tuple[Any, Callable[[Any], list[Any]]]:
    """Run ``fun(*values)`` once, traced; return ``(raw output, back)``.

    ``roots[i]`` says whether ``values[i]`` is differentiated: it is boxed on the trace as its own
    root; the others are passed as they are.  ``pack(out)`` turns the output into the one traced
    value the backward starts from (a tuple of arrays through ``autograd.tuple``, say).  ``back(dy)``
    returns, per value, d<dy, packed output>/d value — ``None`` for values not differentiated and
    for roots the output does not depend on (also when the output was not traced at all); a value
    read by indexing may come back as autograd's dense array of the whole value."""
    nodes = [VJPNode.new_root() if r else None for r in roots]
    with trace_stack.new_trace() as t:
        boxed = [new_box(v, t, n) if n is not None else v for v, n in zip(values, nodes)]
        out = fun(*boxed)
        packed = pack(out)
        end = packed._node if isbox(packed) and packed._trace == t else None
    wanted = {n: i for i, n in enumerate(nodes) if n is not None}

    def back(dy: Any) -> list[Any]:
        grads: list[Any] = [None] * len(nodes)
        if end is None:
            return grads
        pending = {end: (dy, False)}
        for node in toposort(end):
            g = pending.pop(node)
            if node in wanted:
                grads[wanted[node]] = g[0]
                continue
            for parent, ingrad in zip(node.parents, node.vjp(g[0])):
                pending[parent] = add_outgrads(pending.get(parent), ingrad)
        return grads

    return out, back
