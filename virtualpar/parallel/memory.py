"""The memory ledger: what a device holds, measured on the device.

- ``params``: bytes of this device's parameters as stored (tp shards; under ZeRO-3 its dp shard).
- ``grads``: bytes of the gradients the step accumulated (ZeRO-3: shards, reduce-scattered in the
  backward; otherwise the whole local vectors).
- ``optimizer``: bytes of the optimizer state (Adam's m and v: 2 arrays per parameter; ZeRO 1/3:
  of the dp shard only).
- ``gathered``: ZeRO-3's gathered parameters held at once: FSDP gathers one unit at a time into
  one buffer and frees it after the unit's forward and backward (:mod:`.fsdp`), so this is the
  largest unit's whole (tp-local) flat vector; ``params + gathered`` is the peak parameter memory,
  Ψ/N_d + one unit.  0 without ZeRO-3.
- ``activations``: the peak, over the step's schedule, of the bytes the recorded forwards keep for
  their backward (:func:`saved_bytes`), summed over the microbatches in flight; per stage, the
  bytes one microbatch's forward keeps (``stage_activations``).

Activations are measured by walking the graph autograd recorded for a forward — each node's vjp
closure holds the arrays its backward reads — and adding up the distinct float buffers and boolean
dropout masks (one byte an element), parameters excluded.  With ``recompute`` a block's node keeps
only its input (b·s·h, /tp under SP: Korthikanti et al. 2022's "2sbh" for 16-bit activations, here
b·s·h·itemsize).
"""

from __future__ import annotations

import types
from typing import Any, Iterable

import numpy as np
from autograd.core import VJPNode

from ..nn.functional import VJP

__all__ = ["saved_bytes", "Tracked", "ledger"]


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def saved_bytes(rec: Any, exclude: Iterable[np.ndarray] = ()) -> int:
    """Bytes of the distinct float and boolean buffers a recorded forward (an ``nn.vjp`` record)
    keeps for its backward, the buffers of ``exclude`` (the parameters) and views of them left out.  Walks
    functions' closures, tuples, lists, dicts and autograd's nodes — never other objects (a device,
    a module), which would reach far beyond the record."""
    skip = {id(_root(a)) for a in exclude if isinstance(a, np.ndarray)}
    seen: set[int] = set()
    buffers: dict[int, int] = {}
    todo: list[Any] = [getattr(rec, "_back", None)]
    while todo:
        obj = todo.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            root = _root(obj)
            if obj.dtype.kind in "fb" and id(root) not in skip:  # floats and dropout masks
                buffers[id(root)] = root.nbytes
        elif isinstance(obj, types.FunctionType):
            todo.extend(c.cell_contents for c in (obj.__closure__ or ()) if _filled(c))
        elif isinstance(obj, VJP):  # a record inside a record (ZeRO-3's units, :mod:`.fsdp`)
            todo.append(obj._back)
        elif isinstance(obj, VJPNode):
            todo.append(obj.vjp)
            todo.extend(obj.parents)
        elif isinstance(obj, (tuple, list)):
            todo.extend(obj)
        elif isinstance(obj, dict):
            todo.extend(obj.values())
    return sum(buffers.values())


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


class Tracked:
    """A stage's forward record that books its saved bytes on the device's ledger while it is held:
    added at the forward, released by the backward (or its input half, zero-bubble's I)."""

    def __init__(self, rec: Any, st: dict, nbytes: int) -> None:
        self.rec, self.output, self.st, self.nbytes = rec, rec.output, st, nbytes
        held = st["memory"]["held"] = st["memory"]["held"] + nbytes
        st["memory"]["activations"] = max(st["memory"]["activations"], held)

    def _release(self) -> None:
        self.st["memory"]["held"] -= self.nbytes
        self.nbytes = 0

    def backward(self, dy: Any) -> Any:
        out = self.rec.backward(dy)
        self._release()
        return out

    def backward_input(self, dy: Any) -> Any:
        out = self.rec.backward_input(dy)
        self._release()
        return out

    def backward_weight(self, dy: Any = None) -> Any:
        return self.rec.backward_weight(dy)


def _nbytes(tree: Any) -> int:
    if isinstance(tree, np.ndarray):
        return tree.nbytes if tree.ndim else 0  # Adam's 0-d step counters are not state of size Ψ
    if isinstance(tree, dict):
        return sum(_nbytes(v) for v in tree.values())
    return 0


def ledger(dev: Any, key: str) -> dict[str, Any]:
    """This device's memory ledger (see the module doc), after the last step."""
    st = dev.state[key]
    update = st.get("update")
    optimizers = {s: opt for s, (_, opt) in update.items()} if update else st["optimizers"]
    mem = st["memory"]
    return {"params": sum(_nbytes(p) for p in st["params"].values()),
            "grads": mem["grads"],
            "gathered": mem.get("gathered", 0),
            "optimizer": sum(_nbytes(o.state) for o in optimizers.values()),
            "activations": mem["activations"],
            "stage_activations": dict(mem["stage"])}
