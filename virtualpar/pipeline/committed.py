"""The device side of a committed step's copy: prepare the update, report it, place a saved state.

A step stages its gradients; the next one applies them first if the driver committed the step.
The commit is explicit, by version: every run is told the state version the driver last committed
on this cluster (``want``); a step staged from version v makes v + 1, and :func:`settle_all`
adopts a kept update only if it makes ``want`` — a failed step's is dropped, and a device stopped
by someone else's failure before it settled the step before adopts that one late, rather than
falling a step behind its peers.

:func:`step_keeping` runs the step and then *prepares* the update — each stage's optimizer step
taken on a fork of the optimizer (new arrays, its state dicts new), the current weights and
optimizer kept — and returns the prepared weights and optimizer state of the stages this device
reports: one device per stage (the first copy, the first data-parallel replica; stage 0 of a
model every device shares).  The driver keeps them as its copy of the step
(:mod:`virtualpar.checkpoint.recovery`); the update is computed once, as before, only earlier.

Cost per step: one optimizer step (as before, moved earlier) and the reported stages' weights and
optimizer state through the reply pipe, each device's overlapping the others' remaining work.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..checkpoint.recovery import ResumeError
from ..checkpoint.spill import hand_copy, open_spill
from ..checkpoint.state import StageState, fork_optimizer, optimizer_state
from .device_step import run_step

__all__ = ["settle_all", "step_keeping", "fetch_state", "place_state", "open_spill"]


def settle_all(st: dict, want: int, key: str = "") -> None:
    """Bring this device's state to version ``want`` — the driver's last commit on this cluster: adopt
    the prepared update (or apply the staged gradients) that makes ``want``, drop any other."""
    prepared, st["prepared"] = st.get("prepared"), None
    staged, st["staged"] = st.get("staged"), None
    have = st.get("version", 0)
    if have == want:
        return
    if prepared is not None and prepared[0] == want:
        for s, (params, opt) in prepared[1].items():
            st["params"][s], st["optimizers"][s] = params, opt
    elif staged and st.get("staged_for") == want:
        for s, grads in staged.items():
            st["params"][s] = st["optimizers"][s].step(st["params"][s], grads)
    else:
        raise ResumeError(f"the state of {key or 'this operation'} here is version {have}, and no update it "
                          f"kept makes version {want}, which the driver committed")
    st["version"] = want


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


def step_keeping(dev: Any, key: str, rows: int | None, want: int, keep: bool) -> tuple:
    """:func:`~.device_step.run_step` from state version ``want``; its update is staged as version
    ``want + 1`` and, with ``keep``, prepared, and the reported stages' state after it returned:
    ``(loss, pipeline rank, records, {stage: (weights, optimizer state)} or None)``."""
    st = dev.state[key]
    settle_all(st, want, key)
    loss, prank, records = run_step(dev, key, rows, False)
    if not keep:
        st["staged_for"] = want + 1
        return loss, prank, records, None
    staged, st["staged"] = st.get("staged"), None
    prepared = {}
    for s, grads in (staged or {}).items():
        opt = fork_optimizer(st["optimizers"][s])
        prepared[s] = (opt.step(st["params"][s], grads), opt)
    st["prepared"] = (want + 1, prepared)
    mine = {s: (prepared[s][0], optimizer_state(prepared[s][1])) for s in _reported(dev, st) if s in prepared}
    return loss, prank, records, hand_copy(st, want + 1, mine)


def fetch_state(dev: Any, key: str, want: int) -> dict[int, tuple[dict, dict]]:
    """The reported stages' weights and optimizer state at version ``want``."""
    st = dev.state[key]
    settle_all(st, want, key)
    return {s: (dict(st["params"][s]), optimizer_state(st["optimizers"][s])) for s in _reported(dev, st)}


def place_state(dev: Any, key: str, stages: dict[int, StageState], version: int) -> None:
    """Replace the weights and optimizer state of every stage this device keeps by ``stages``' (a
    shared model's devices all take stage 0's), as state ``version``; anything staged is dropped."""
    st = dev.state[key]
    shared = st["spec"].shared_axis is not None
    for s in st["params"]:
        src = stages[0 if shared else s]
        st["params"][s] = {k: np.array(v, copy=True) for k, v in src.params.items()}
        opt = st["optimizers"][s]
        opt.t, opt.lr = int(src.optimizer["t"]), float(src.optimizer["lr"])
        opt.state = {k: {slot: np.array(v, copy=True) for slot, v in d.items()}
                     for k, d in src.optimizer["state"].items()}
    st["staged"] = st["prepared"] = None
    st["version"] = version
