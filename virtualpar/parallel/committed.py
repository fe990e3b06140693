"""The device side of a ``ParallelTrainer``'s committed steps: versions, the driver copy, a placed state.

:mod:`.device_step` computes each step's update next to the committed parameters (all or nothing).
Here the commit is made explicit by version, as :mod:`virtualpar.pipeline.committed` does for the
pipeline: every run is told the state version the driver last committed on this cluster
(``want``); the update a step computed from version v makes v + 1, and :func:`settle` adopts it only
if it makes ``want`` — a failed step's update is dropped.

What a device reports of a step (to its slot file, :mod:`virtualpar.checkpoint.spill`, or in its
reply) is its **raw** state: per pipeline stage it holds, per unit, its flat vector and optimizer
slots as it keeps them — under ZeRO (1 and 3) its dp shard of them, so every dp rank reports its
1/dp and nothing is gathered (no collective is added to a step); without ZeRO the first dp replica
reports the whole vectors.  Context-parallel ranks hold copies: only cp rank 0 reports.  The driver
puts the pieces together (:mod:`.checkpoints`).  Each report is keyed by :func:`raw_id`.

Cost per step: one ``pwrite`` per array of the reported state (parameters and optimizer slots:
3Ψ/(tp·pp) elements per reporting device under Adam), spread over the devices.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..checkpoint.recovery import ResumeError
from ..checkpoint.spill import hand_copy, open_spill
from ..checkpoint.state import optimizer_state
from .device_step import fetch, step

__all__ = ["raw_id", "settle", "step_keeping", "fetch_raw", "fetch_weights", "place_state", "open_spill"]


def raw_id(stage: int, tp_rank: int, dp_rank: int, tp: int, dp: int) -> int:
    """The id a device reports its part of ``stage`` under: one per (stage, tp rank, dp shard)."""
    return (stage * tp + tp_rank) * dp + dp_rank


def settle(st: dict, want: int, key: str = "") -> None:
    """Bring this device's state to version ``want``, the driver's last commit on this cluster: adopt
    the update that makes ``want``, drop any other."""
    update, st["update"] = st.get("update"), None
    have = st.get("version", 0)
    if have == want:
        return
    if update is not None and st.get("update_for") == want:
        for s, (params, optimizer) in update.items():
            st["params"][s], st["optimizers"][s] = params, optimizer
        st["version"] = want
        return
    raise ResumeError(f"the state of {key or 'this trainer'} here is version {have}, and no update it "
                      f"kept makes version {want}, which the driver committed")


def _coords(dev: Any) -> tuple[int, int, int]:
    return dev.group_rank("dp"), dev.group_rank("tp"), dev.group_rank("cp")


def _reported(dev: Any, st: dict, stages: dict[int, tuple[dict, Any]]) -> dict[int, tuple[dict, dict]]:
    """This device's raw reports of ``stages`` ({stage: (flat parameters, optimizer)}): see the module
    doc for who reports what."""
    meta = st["meta"]
    d, t, c = _coords(dev)
    zero, dp, tp = meta["zero"], meta["dp"], meta["tp"]
    if c != 0 or (zero == 0 and d != 0):
        return {}
    out = {}
    for s, (params, optimizer) in stages.items():
        if zero == 1 and dp > 1:  # whole parameters, sharded optimizer: report the same shard of both
            params = {n: np.array_split(p, dp)[d] for n, p in params.items()}
        out[raw_id(s, t, d if zero else 0, tp, dp if zero else 1)] = (params, optimizer_state(optimizer))
    return out


def step_keeping(dev: Any, key: str, rows: int, want: int, keep: bool, flops: dict, number: int = 0) -> tuple:
    """:func:`~.device_step.step` number ``number`` (its dropout masks) from state version ``want``;
    its update makes ``want + 1`` and, with ``keep``, this device's raw report of it is written to
    its slot file (or returned when it has none): ``(loss, pipeline rank, records, reports or
    None)``."""
    st = dev.state[key]
    settle(st, want, key)
    loss, prank, records = step(dev, key, rows, False, flops, number)
    st["update_for"] = want + 1
    if not keep:
        return loss, prank, records, None
    mine = _reported(dev, st, st["update"])
    return loss, prank, records, hand_copy(st, want + 1, mine)


def fetch_raw(dev: Any, key: str, want: int) -> dict[int, tuple[dict, dict]]:
    """This device's raw report of the committed state at version ``want``."""
    st = dev.state[key]
    settle(st, want, key)
    return _reported(dev, st, {s: (st["params"][s], st["optimizers"][s]) for s in st["params"]})


def fetch_weights(dev: Any, key: str, want: int) -> dict[int, dict[str, np.ndarray]]:
    """This device's stages' whole local flat vectors at version ``want`` (ZeRO-3 gathers over dp)."""
    settle(dev.state[key], want, key)
    return fetch(dev, key, False)


def place_state(dev: Any, key: str, version: int) -> None:
    """Take what the driver put under ``key + "/restore"`` ({stage: (flat parameters, optimizer state
    {"t", "lr", "state"})}, already cut for this device) as its committed state ``version``."""
    st = dev.state[key]
    stages = dev.state.pop(key + "/restore")
    for s, (params, opt_state) in stages.items():
        st["params"][s] = params
        opt = st["optimizers"][s]
        opt.t, opt.lr = int(opt_state["t"]), float(opt_state["lr"])
        opt.state = opt_state["state"]
    st["update"] = None
    st["version"] = version
