"""Timeline parallelism, as seed 000's user writes it: a GRU sequence classifier whose sequence is
split along time across the devices of mesh axis "time", trained on synthetic data.

    python examples/timeline_rnn.py

The model subclasses ``SequencePipe`` and writes only ``forward``, ``loss_fn``,
``get_init_states`` and ``get_group`` — no backward code.  Labels are read at the last step of
each sequence, for the rows the mask keeps.
"""

from __future__ import annotations

import numpy as np

from virtualpar import Mesh, VirtualCluster, nn
from virtualpar.timeline import SequencePipe, TimelineParallel, reference_step


class SimpleRNN(SequencePipe):
    def __init__(self, num_classes: int, hidden_dims: int, num_layers: int, group: str = "time",
                 dtype=np.float64) -> None:
        self.group = group
        self.num_layers, self.hidden_dims = num_layers, hidden_dims
        self.gru = nn.GRU(hidden_dims, hidden_dims, num_layers=num_layers, seed=1, dtype=dtype)
        self.out = nn.Linear(hidden_dims, num_classes, seed=2, dtype=dtype)

    def forward(self, inputs, states):
        x, = inputs                       # (N, L, H)
        h, = states                       # (N, layers, H), batch first like the inputs
        x, h = self.gru(x, h.transpose((1, 0, 2)))  # (layers, N, H) for the GRU
        return (self.out(x),), (h.transpose((1, 0, 2)),)

    def loss_fn(self, inputs, labels):
        x, = inputs
        mask, y = labels
        return nn.cross_entropy(x[:, -1], y, mask=mask)  # the label of each kept row, at its last step

    def get_init_states(self):
        return (np.zeros((self.num_layers, self.hidden_dims), dtype=self.dtype),)

    def get_group(self):
        return self.group


def synthetic(batch: int = 8, length: int = 12, hidden: int = 6, seed: int = 0):
    """Sequences whose class is the sign of the sum of their first feature; a third of the rows masked."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, length, hidden))
    y = (x[:, :, 0].sum(axis=1) > 0).astype(np.int64)
    mask = rng.random(batch) > 0.33
    mask[0] = True
    return (x,), (mask, y)


def main() -> None:
    inputs, labels = synthetic()
    model = SimpleRNN(num_classes=2, hidden_dims=6, num_layers=2)
    op = TimelineParallel(model, microbatches=2, optimizer=nn.Adam(0.05))
    with VirtualCluster(Mesh({"time": 3})) as cluster:
        losses = [cluster.execute(op, inputs, labels) for _ in range(8)]
    print("losses:", ", ".join(f"{v:.4f}" for v in losses))
    # the same model, the whole sequence on one device: its loss is the first step's, before any update
    one_device, _ = reference_step(SimpleRNN(num_classes=2, hidden_dims=6, num_layers=2), inputs, labels, microbatches=2)
    print(f"first step's loss on one device running the whole sequence: {one_device:.12f} "
          f"(time-split: {losses[0]:.12f}; equal: {abs(one_device - losses[0]) <= 1e-12 * abs(one_device)})")
    print("timeline of the last step (3 time segments x 2 microbatches):")
    print(op.timeline())


if __name__ == "__main__":
    main()
