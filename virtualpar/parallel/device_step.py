"""The device side of a ``ParallelTrainer`` step: place the shards, run the one pipeline executor,
reduce the gradients, compute the update aside; fetch the weights.  Device protocol only.

All or nothing: a step computes its new parameters and optimizer states next to the committed
ones; the driver tells the next run (or the weight fetch) whether the step succeeded on every
device, and only then are they swapped in (:func:`settle`)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from ..pipeline.device_step import run_step
from .zero import apply_update, full_params, reduce_gradients

__all__ = ["place", "step", "fetch"]


def place(dev: Any, key: str) -> None:
    """Keep what the driver put under ``key + "/init"`` as this device's state for ``key``."""
    init = dev.state.pop(key + "/init")
    dev.state[key] = {**init, "modules": {}, "staged": None, "update": None, "memory": _fresh_ledger()}


def _fresh_ledger() -> dict:
    return {"held": 0, "activations": 0, "stage": {}, "grads": 0, "gathered": 0}


def settle(st: dict, commit: bool) -> None:
    """Swap in the parameters and optimizer states the last step computed if it succeeded on every
    device (``commit``), else drop them.  Local only: every collective of the update (ZeRO-1's
    all_gather) ran inside the step, so a fault anywhere in a step leaves every device as it was."""
    update, st["update"] = st.get("update"), None
    if update and commit:
        for s, (params, optimizer) in update.items():
            st["params"][s], st["optimizers"][s] = params, optimizer


def step(dev: Any, key: str, rows: int, commit: bool, flops: dict[int, float], number: int = 0
         ) -> tuple[float | None, int, list[tuple[str, float, float, float, float]]]:
    """One training step on this device: the executor runs the schedule (forward, backward, the
    microbatches' gradient sums), then the gradients are reduced and the update staged.  Returns the
    executor's (this replica's loss on a last-stage device, else None; pipeline rank; records).
    ``number``: the training step's index (its dropout masks, :mod:`virtualpar.nn.dropout`)."""
    st = dev.state[key]
    settle(st, commit)
    st["flops"] = flops
    st["number"], st["rows"] = number, rows
    st["memory"] = _fresh_ledger()
    st["seen"], st["summed"] = {}, set()  # zero=0's buckets reduced during the backward (.overlap)
    loss, prank, records = run_step(dev, key, rows, False)
    dev.wait_comm_stream()  # zero=0's buckets (.overlap) end before the optimizer, as DDP synchronises
    grads, st["staged"] = st["staged"] or {}, None
    st["memory"]["grads"] = sum(g.nbytes for stage in grads.values() for g in stage.values())
    meta = st["meta"]
    update = {}
    for s in sorted(grads):
        optimizer = copy.deepcopy(st["optimizers"][s])  # stepped aside: the committed one stays as it was
        reduced = reduce_gradients(dev, meta, st["units"][s], grads[s], summed=s in st["summed"])
        update[s] = (apply_update(dev, meta, st["params"][s], optimizer, reduced), optimizer)
    st["update"] = update
    return loss, prank, records


def fetch(dev: Any, key: str, commit: bool) -> dict[int, dict[str, np.ndarray]]:
    """This device's stages' whole local flat vectors (after applying a committed update)."""
    st = dev.state[key]
    settle(st, commit)
    return {s: full_params(dev, st["meta"], st["params"][s]) for s in sorted(st["params"])}
