"""Timeline parallelism's part of ``virtualpar tour``: a GRU classifier split over 3 time
segments."""

from __future__ import annotations

from typing import TextIO

import numpy as np

from .. import nn
from ..mesh import Mesh
from ..runtime import VirtualCluster
from ..sim import Hardware
from ..timeline import SequencePipe, TimelineParallel, reference_step
from ..trace.fmt import number

__all__ = ["tour_section", "TinyGRU"]


class TinyGRU(SequencePipe):
    """Seed 000's model in miniature: a GRU, a linear read-out, the label at the last step."""

    def __init__(self, hidden: int = 6, classes: int = 2) -> None:
        self.gru = nn.GRU(hidden, hidden, seed=1, dtype=np.float64)
        self.out = nn.Linear(hidden, classes, seed=2, dtype=np.float64)

    def forward(self, inputs, states):
        x, = inputs
        h, = states
        x, h = self.gru(x, h.transpose((1, 0, 2)))
        return (self.out(x),), (h.transpose((1, 0, 2)),)

    def loss_fn(self, inputs, labels):
        x, = inputs
        mask, y = labels
        return nn.cross_entropy(x[:, -1], y, mask=mask)

    def get_init_states(self):
        return (np.zeros((1, 6)),)

    def get_group(self):
        return "time"


def tour_section(out: TextIO, hardware: str | None) -> bool:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 12, 6))
    labels = (np.ones(6, bool), (x[:, :, 0].sum(axis=1) > 0).astype(np.int64))
    D, M = 3, 3
    op = TimelineParallel(TinyGRU(), microbatches=M, optimizer=nn.SGD(1.0), costs={"F": 1, "B": 1})
    before = TinyGRU().state_dict()
    with VirtualCluster(Mesh({"time": D}), hardware=Hardware.unit()) as cluster:
        loss = cluster.execute(op, (x,), labels)
        after = op.state_dict(cluster)
        makespan = max(cluster.clocks())
    _, want = reference_step(TinyGRU(), (x,), labels, microbatches=M)
    exact = all(np.allclose(before[k] - after[k], want[k], rtol=1e-8, atol=1e-12) for k in want)
    out.write(f"A 12-step sequence split into {D} time segments on {D} devices, {M} microbatches "
              f"pipelined;\neach device passes its GRU state on and the state's gradient back "
              f"(loss {loss:.4f}):\n")
    out.write(str(op.timeline()) + "\n")  # the timeline fits the width itself
    out.write(f"makespan {number(makespan)} units = 2(M + D - 1) = {2 * (M + D - 1)}; gradients equal one "
              f"device running the whole sequence: {'yes' if exact else 'NO'}\n")
    return exact and makespan == 2 * (M + D - 1)
