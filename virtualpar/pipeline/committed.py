"""The device side of a committed step's copy: prepare the update, report it, place a saved state.

A step stages its gradients (:func:`~.device_step.settle` applies them when the driver says the
step succeeded everywhere).  :func:`step_keeping` runs the step and then *prepares* the update —
each stage's optimizer step taken on a fork of the optimizer (new arrays, its state dicts new),
the current weights and optimizer kept — and returns the prepared weights and optimizer state of
the stages this device reports: one device per stage (the first copy, the first data-parallel
replica; stage 0 of a model every device shares).  The driver keeps them as its copy of the
step; the next step (or a fetch) adopts the prepared update if the driver commits it, and drops
it otherwise — the same all-or-nothing as before, with the update computed once.

Cost per step: one optimizer step (as before, moved earlier) and the reported stages' weights and
optimizer state through the reply pipe, each device's overlapping the others' remaining work.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..checkpoint.state import StageState, fork_optimizer, optimizer_state
from .device_step import run_step, settle

__all__ = ["settle_all", "step_keeping", "fetch_state", "place_state"]


def settle_all(st: dict, commit: bool) -> None:
    """Adopt a prepared update (``commit``) or drop it, then settle plain staged gradients likewise."""
    prepared, st["prepared"] = st.get("prepared"), None
    if prepared and commit:
        for s, (params, opt) in prepared.items():
            st["params"][s], st["optimizers"][s] = params, opt
    settle(st, commit)


def _reported(dev: Any, st: dict) -> list[int]:
    """The stages whose state this device reports to the driver (one device per stage)."""
    spec = st["spec"]
    if spec.dp_axis is not None and dev.group_rank(spec.dp_axis) != 0:
        return []
    if spec.shared_axis is not None:  # one set of weights on every device: stage 0's holder reports it
        return [0] if 0 in st["params"] else []
    me, placement = dev.group_rank(spec.axis), spec.placement
    out = []
    for s in st["params"]:
        copies = placement.copies.get(s)
        if (copies[0] if copies else placement.weight_rank(s)) == me:
            out.append(s)
    return out


def step_keeping(dev: Any, key: str, rows: int | None, commit: bool, keep: bool) -> tuple:
    """:func:`~.device_step.run_step`, then (``keep``) the update prepared and the reported stages'
    state after it: ``(loss, pipeline rank, records, {stage: (weights, optimizer state)} or None)``."""
    st = dev.state[key]
    settle_all(st, commit)
    loss, prank, records = run_step(dev, key, rows, False)
    if not keep:
        return loss, prank, records, None
    staged, st["staged"] = st.get("staged"), None
    prepared = {}
    for s, grads in (staged or {}).items():
        opt = fork_optimizer(st["optimizers"][s])
        prepared[s] = (opt.step(st["params"][s], grads), opt)
    st["prepared"] = prepared
    return loss, prank, records, {s: (prepared[s][0], optimizer_state(prepared[s][1]))
                                  for s in _reported(dev, st) if s in prepared}


def fetch_state(dev: Any, key: str, commit: bool) -> dict[int, tuple[dict, dict]]:
    """The reported stages' weights and optimizer state, the last step settled first."""
    st = dev.state[key]
    settle_all(st, commit)
    return {s: (dict(st["params"][s]), optimizer_state(st["optimizers"][s])) for s in _reported(dev, st)}


def place_state(dev: Any, key: str, stages: dict[int, StageState]) -> None:
    """Replace the weights and optimizer state of every stage this device keeps by ``stages``' (a
    shared model's devices all take stage 0's); anything staged is dropped."""
    st = dev.state[key]
    shared = st["spec"].shared_axis is not None
    for s in st["params"]:
        src = stages[0 if shared else s]
        st["params"][s] = {k: np.array(v, copy=True) for k, v in src.params.items()}
        opt = st["optimizers"][s]
        opt.t, opt.lr = int(src.optimizer["t"]), float(src.optimizer["lr"])
        opt.state = {k: {slot: np.array(v, copy=True) for slot, v in d.items()} for k, d in src.optimizer["state"].items()}
    st["staged"] = st["prepared"] = None
