"""Regenerate the pictures of README.md and docs/ from virtualpar's own code.

    python docs/images/make_images.py          # writes docs/images/pipeline-1f1b.png

``pipeline-1f1b.png``: one training step of a 4-stage MLP under the 1F1B schedule, 8 microbatches,
on 4 device processes, drawn from the cluster's trace on the modelled clock (``trace.to_png``).
The forward and backward of each stage are charged 20 and 40 MFLOP (``PipelinedOperation(costs=)``)
on the ``laptop`` preset, so that compute, not the tiny test matrices, sets the picture's scale.
Needs matplotlib (``pip install -e ".[viz]"``).
"""

from __future__ import annotations

import os

import numpy as np

from virtualpar import VirtualCluster, nn
from virtualpar.pipeline import Pipeline, PipelinedOperation
from virtualpar.trace import to_png

HERE = os.path.dirname(os.path.abspath(__file__))


def pipeline_1f1b(path: str) -> str:
    layers = []
    for i in range(4):
        layers += [nn.Linear(64, 64, seed=i), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    x, y = np.ones((32, 64), np.float32), np.zeros((32, 64), np.float32)
    op = PipelinedOperation(Pipeline(model, cuts=[2, 4, 6]), "1f1b", microbatches=8,
                            costs={"F": 2e7, "B": 4e7})
    with VirtualCluster(4, hardware="laptop") as cluster:
        cluster.execute(op, x, y)       # the first step places the weights
        cluster.trace(clear=True)
        cluster.execute(op, x, y)       # the step we draw
        trace = cluster.trace()
    return to_png(trace, path, clock="model", flows=False, dpi=80,
                  title="1F1B, 4 stages x 8 microbatches: one training step on the modelled clock")


if __name__ == "__main__":
    print(pipeline_1f1b(os.path.join(HERE, "pipeline-1f1b.png")))
