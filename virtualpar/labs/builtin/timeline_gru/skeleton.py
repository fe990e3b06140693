"""Lab: timeline parallelism for a GRU — a recurrent model split along TIME across devices.

``SequencePipe`` runs a recurrent model with its sequence cut into equal time segments, one per
device of a mesh axis: device i runs segment i of every microbatch, starting from the recurrent
state device i-1 hands it, and hands its final state on.  Microbatches are pipelined (1F1B).  You
write only the model's pieces — no communication and no backward: virtualpar does both.

TASK 1  (in the class below)
    ``forward(inputs, states)``: inputs is ``(x,)`` with x (batch, steps, hidden); states is
    ``(h,)`` with h (batch, layers, hidden).  Run ``self.gru`` (it wants h as (layers, batch,
    hidden)) and ``self.out`` on every step; return ``((logits,), (h_out,))`` with h_out batch-first
    again.  ``loss_fn(outputs, labels)``: labels is ``(y,)``, int classes; the cross-entropy
    (``nn.cross_entropy``) of the LAST step's logits.  ``get_init_states()``: ``(zeros(layers,
    hidden),)`` — per sample, virtualpar broadcasts it over the batch.
TASK 2
    ``timeline_makespan(devices, microbatches, backward)``: the modelled makespan of one training
    step when a segment's forward costs 1 and its backward ``backward`` (free links).

HOW IT IS CHECKED  (virtualpar lab check timeline-gru timeline_gru.py)
    The loss equals a single-device GRU over the whole sequence; the time-split gradients equal the
    whole-sequence gradients (within 1e-10) on 1 to 4 devices and 1 or 2 microbatches; the makespan
    formula against the closed form and against an executed run on the modelled clock.
"""

import numpy as np

from virtualpar import nn
from virtualpar.timeline import SequencePipe


class GRUClassifier(SequencePipe):
    def __init__(self, num_classes=2, hidden=6, num_layers=2):
        self.num_layers, self.hidden = num_layers, hidden
        self.gru = nn.GRU(hidden, hidden, num_layers=num_layers, seed=1, dtype=np.float64)
        self.out = nn.Linear(hidden, num_classes, seed=2, dtype=np.float64)

    def forward(self, inputs, states):
        # TODO 1: unpack x and h, run self.gru with h as (layers, batch, hidden), then self.out
        raise NotImplementedError("write forward")

    def loss_fn(self, outputs, labels):
        # TODO 2: cross-entropy of the last step's logits against y
        raise NotImplementedError("write loss_fn")

    def get_init_states(self):
        # TODO 3: a tuple with one array of zeros (layers, hidden)
        raise NotImplementedError("write get_init_states")

    def get_group(self):
        return "time"


def timeline_makespan(devices, microbatches, backward):
    # TODO 4: the 1F1B makespan with forward 1 and backward `backward` per segment
    raise NotImplementedError("write timeline_makespan")
