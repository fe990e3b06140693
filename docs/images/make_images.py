"""Regenerate the pictures of README.md and docs/ from virtualpar's own runs.

    python docs/images/make_images.py          # writes docs/images/pipeline-1f1b.png

``pipeline-1f1b.png``: one training step of a 4-stage MLP under the 1F1B schedule, 8 microbatches,
executed on 4 device processes.  Each box is an action as it ran on the modelled clock (the
operation's ``last_records``), coloured by kind and labelled with its microbatch; gaps are the
pipeline's bubbles.  The forward and backward of each stage are charged 20 and 40 MFLOP
(``PipelinedOperation(costs=)``) on the ``laptop`` preset, so that the schedule, not the tiny test
matrices, sets the picture.  Needs matplotlib (``pip install -e ".[viz]"``).
"""

from __future__ import annotations

import os

import numpy as np

from virtualpar import VirtualCluster, nn
from virtualpar.pipeline import Action, Pipeline, PipelinedOperation

HERE = os.path.dirname(os.path.abspath(__file__))
COLOURS = {"F": "#4c72b0", "B": "#55a868", "I": "#8fbc8f", "W": "#c9a227"}
NAMES = {"F": "forward", "B": "backward", "I": "input gradient", "W": "weight gradient"}


def run_1f1b(stages: int = 4, microbatches: int = 8) -> dict[int, list[tuple[Action, float, float]]]:
    """Per pipeline rank, the compute actions of one executed 1F1B step with their modelled start and end."""
    layers: list[nn.Module] = []
    for i in range(stages):
        layers += [nn.Linear(64, 64, seed=i), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    cuts = [2 * s for s in range(1, stages)]
    x, y = np.ones((4 * microbatches, 64), np.float32), np.zeros((4 * microbatches, 64), np.float32)
    op = PipelinedOperation(Pipeline(model, cuts=cuts), "1f1b", microbatches=microbatches,
                            costs={"F": 2e7, "B": 4e7})
    with VirtualCluster(stages, hardware="laptop") as cluster:
        cluster.execute(op, x, y)       # the first step places the weights
        cluster.execute(op, x, y)       # the step we draw
    rows = {}
    for rank, records in sorted(op.last_records.items()):
        actions = [(a if isinstance(a, Action) else Action.from_str(a), m0, m1) for a, _, _, m0, m1 in records]
        rows[rank] = [(a, m0, m1) for a, m0, m1 in actions if a.kind in COLOURS]
    return rows


def draw(rows: dict[int, list[tuple[Action, float, float]]], path: str, title: str) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    t0 = min(m0 for row in rows.values() for _, m0, _ in row)
    t1 = max(m1 for row in rows.values() for _, _, m1 in row)
    busy = sum(m1 - m0 for row in rows.values() for _, m0, m1 in row)
    bubble = 1 - busy / (len(rows) * (t1 - t0))
    fig = Figure(figsize=(10, 0.55 * len(rows) + 1.3), dpi=90)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for rank, row in rows.items():
        y = len(rows) - 1 - rank
        for a, m0, m1 in row:
            x, w = (m0 - t0) * 1e3, (m1 - m0) * 1e3
            ax.broken_barh([(x, w)], (y - 0.4, 0.8), facecolors=COLOURS[a.kind], edgecolors="white", linewidth=1)
            ax.text(x + w / 2, y, str(a.microbatch), ha="center", va="center", fontsize=8, color="white")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"device {r} (stage {r})" for r in sorted(rows, reverse=True)], fontsize=9)
    ax.set_xlim(0, (t1 - t0) * 1e3)
    ax.set_xlabel("modelled time [ms]; each box is one microbatch's forward or backward of that device's stage")
    kinds = sorted({a.kind for row in rows.values() for a, _, _ in row}, key="FBIW".index)
    ax.legend(handles=[Patch(facecolor=COLOURS[k], label=NAMES[k]) for k in kinds], loc="lower right",
              bbox_to_anchor=(1.0, 1.0), fontsize=8, ncol=len(kinds), frameon=False)
    ax.set_title(f"{title}: makespan {(t1 - t0) * 1e3:.2f} ms, bubble {bubble:.0%}", loc="left", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


if __name__ == "__main__":
    print(draw(run_1f1b(), os.path.join(HERE, "pipeline-1f1b.png"), "1F1B, 4 stages x 8 microbatches"))
