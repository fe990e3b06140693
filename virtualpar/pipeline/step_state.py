"""One device's state during a pipelined step (:mod:`.device_step` runs the actions on it): the
microbatches it holds, what passes between stages, the gradients it accumulates in place, and the
charge of a compute action to the modelled clock from the FLOPs its stage declared."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import nn
from .actions import ActionRecord

__all__ = ["StepState", "declared_flops"]


class StepState:
    """One device's state during one pipelined step: its microbatches of the inputs and targets, the
    values between stages (``inbox`` here, ``outbox`` to send), stashed activations, accumulated
    gradients, losses, pending sends and the records of what ran."""

    def __init__(self, dev: Any, st: dict, x: Any, y: Any, rows: int | None = None) -> None:
        spec = st["spec"]
        self.dev, self.st, self.spec = dev, st, spec
        self.group = dev.group(spec.axis)
        self.where = spec.placement.rank_of  # (stage, microbatch) -> pipeline rank
        self.me = dev.group_rank(spec.axis)
        M = spec.microbatches
        self.xs = _split(x, M)
        self.ys = _split(y, M)
        first = x if x is not None else y
        first = first[0] if isinstance(first, tuple) else first
        # rows per microbatch, for the modelled FLOPs: a middle stage holds neither x nor y
        self.rows = (np.shape(first)[0] if first is not None else (rows or 0)) // M
        self.inbox: dict[tuple[str, int, int], Any] = {}
        self.outbox: dict[tuple[str, int, int], Any] = {}
        self.stash: dict[tuple[int, int], Any] = {}
        self.grads: dict[int, dict[str, np.ndarray]] = {}
        self.losses: dict[int, float] = {}
        self.sends: list[Any] = []
        self.records: list[ActionRecord] = []

    def peer(self, stage: int, m: int) -> int:
        return self.group[self.where(stage, m)]

    def holds(self, stage: int) -> bool:
        """Does this rank keep ``stage``'s weights (and step its optimizer)?"""
        copies = self.spec.placement.copies.get(stage)
        return self.me in copies if copies is not None else self.spec.placement.weight_rank(stage) == self.me

    def params(self, stage: int, m: int) -> dict[str, np.ndarray]:
        return self.st["params"][stage] if self.holds(stage) else self.inbox.pop(("W", stage, m))

    def tag(self, kind: str, stage: int, m: int) -> int:
        return 1 + 4 * (stage * self.spec.microbatches + m) + "FBWG".index(kind)

    def charge(self, kind: str, stage: int) -> None:
        """Charge a compute action: its ``costs`` entry when the step has costs, else the FLOPs the
        stage declared per row for this kind (``PipelineStage.action_flops``) times the rows."""
        costs = self.spec.costs
        if costs is not None:
            self.dev.compute(flops=float(costs.get(kind, 0.0)), name=kind)
        else:
            self.dev.compute(flops=declared_flops(self.st["flops"][stage], kind) * self.rows, name=kind)

    def deliver(self, kind: str, stage: int, m: int, value: Any) -> None:
        """Hand a value to the stage that consumes it: in memory on this rank, else via the outbox."""
        target = stage + 1 if kind == "F" else stage - 1
        if self.where(target, m) == self.where(stage, m):
            self.inbox[(kind, target, m)] = value
        else:
            self.outbox[(kind, stage, m)] = value

    def accumulate(self, stage: int, g: dict[str, np.ndarray], m: int | None = None) -> None:
        if m is not None and not self.holds(stage):  # computed here, kept elsewhere: send it back
            self.outbox[("G", stage, m)] = g
            return
        acc = self.grads.get(stage)
        if acc is None:  # the first microbatch's gradients become the sum, unless they are someone's view
            self.grads[stage] = {k: v if _own(v) else np.array(v, copy=True) for k, v in g.items()}
            return
        for k, v in acc.items():  # in place: a fresh 2 MiB sum per microbatch cost ~0.5 ms of page faults
            if np.result_type(v, g[k]) == v.dtype:
                np.add(v, g[k], out=v)
            else:
                acc[k] = v + g[k]


def declared_flops(declared: Any, kind: str) -> float:
    """A stage's declared FLOPs per row for action ``kind``: ``declared`` is ``{"F", "I", "W"}``
    (``B`` defaults to ``I + W``), or a bare number, the forward of a stage that declares only it,
    whose backward parts are then each its size (a matmul's, ``kernels.matmul_backward_flops``)."""
    if not isinstance(declared, dict):
        declared = {"F": declared, "I": declared, "W": declared}
    if kind == "B":
        return float(declared.get("B", declared["I"] + declared["W"]))
    return float(declared[kind])


def _own(a: Any) -> bool:
    """May the sum of gradients grow in ``a`` itself: a writable ndarray no one else holds a view of?"""
    return isinstance(a, np.ndarray) and a.flags.owndata and a.flags.writeable


def _split(v: Any, M: int) -> list | None:
    """Microbatches of an array, or of each array of a tuple (a timeline step's inputs)."""
    if v is None:
        return None
    if isinstance(v, tuple):
        return list(zip(*(nn.split_microbatches(a, M) for a in v)))
    return nn.split_microbatches(v, M)
