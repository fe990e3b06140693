"""ZeRO-3's per-unit gather as FSDP does it: gathered for the forward, freed, gathered again for the backward.

Under ``zero=3`` a device stores its 1/N_d shard of each unit's flat vector (:mod:`.layout`).
Before a unit runs, the shards are all-gathered over dp; FSDP (Zhao et al. 2023) then frees the
gathered parameters once the unit's forward is done and all-gathers them again just before its
backward, so a device holds Ψ/N_d of stored parameters plus the one unit being computed — not
every gathered unit of every microbatch in flight, which is what keeping them for the backward
would cost.

Here the gathered parameters live in ONE buffer per device (the size of its largest unit), into
which every unit is gathered in turn: FSDP's storage that is freed and refilled.  :func:`fsdp_unit`
records the unit's forward (its activations are kept as usual) against a view of that buffer; the
next unit's gather overwrites it; the backward first gathers the unit again into the buffer — the
same values, so every view the recorded forward kept reads exactly what it read in the forward —
then runs the recorded backward and reduce-scatters the gradient over dp.  Per unit and
microbatch: all_gather (forward) + all_gather (backward) + reduce_scatter, each (N_d−1)/N_d of
the unit: FSDP's 3·(N_d−1)/N_d·Ψ per step.

The ledger (:mod:`.memory`) counts the buffer as parameters (``gathered``), never as activations.
Tied embeddings (the head reading the embedding's parameters from another unit) keep the
embedding's and the head's gathered parameters instead (one stage only, so one buffer-less pair).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from autograd.extend import defvjp_argnums, primitive

from .. import nn

__all__ = ["fsdp_unit", "Gatherer"]


class Gatherer:
    """A device's gather buffer and the ledger it books into (an object, so that the memory walk of
    :mod:`.memory`, which follows closures, dicts and lists, never wanders from a record into them)."""

    def __init__(self, dev: Any, st: dict) -> None:
        self.dev, self.st = dev, st

    def gather(self, shard: np.ndarray) -> np.ndarray:
        """All-gather ``shard`` over dp into the device's one gather buffer; returns the filled view."""
        st = self.st
        whole = self.dev.all_gather(np.ascontiguousarray(shard), dim=0, group="dp")
        buf = st.get("gather_buffer")
        if buf is None:  # sized once for the largest unit: a buffer replaced later would stay alive in the
            # records that view it
            size = max(u.padded for s in st["params"] for u in st["units"][s])
            buf = st["gather_buffer"] = np.empty(size, whole.dtype)
        view = buf[:whole.size]
        view[...] = whole
        self.note(whole.nbytes)
        return view

    def note_unit(self, unit: Any) -> None:
        """Book unit ``unit``'s whole flat vector as gathered (a recomputed block's transient gather)."""
        stored = next(iter(next(iter(self.st["params"].values())).values()))
        self.note(unit.padded * stored.itemsize)

    def note(self, nbytes: int) -> None:
        """Book ``nbytes`` of gathered parameters alive at once (the ledger keeps the peak)."""
        mem = self.st["memory"]
        mem["gathered"] = max(mem.get("gathered", 0), nbytes)


@primitive
def fsdp_unit(x: Any, shard: np.ndarray, fn: Callable[[Any, Any], Any], gatherer: Gatherer,
              record: list) -> Any:
    """``fn(x, gathered)``, recorded against the gather buffer, which the next unit may overwrite;
    ``record`` (a fresh list) receives the recorded forward for the backward."""
    full = gatherer.gather(shard)
    takes_grad = isinstance(x, np.ndarray) and x.dtype.kind == "f"
    rec = nn.vjp(lambda p, xx: fn(xx, p["flat"]), x, params={"flat": full}, input_grads=takes_grad)
    record.append(rec)
    return rec.output


def _fsdp_back(argnums: tuple[int, ...], ans: Any, args: tuple, kwargs: dict) -> Callable[[Any], tuple]:
    shard, gatherer, record = args[1], args[3], args[4]

    def vjp(g: Any) -> tuple:
        gatherer.gather(shard)  # the same values again, where the recorded forward's views look
        dx, dp = record.pop().backward(g)
        flat = np.ascontiguousarray(dp["flat"])
        grads = {0: dx, 1: gatherer.dev.reduce_scatter(flat, dim=0, op="sum", group="dp")}
        return tuple(grads[i] for i in argnums)
    return vjp


defvjp_argnums(fsdp_unit, _fsdp_back)
