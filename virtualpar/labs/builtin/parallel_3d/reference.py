"""Reference solution of the 3D-parallel transformer lab (kept out of the skeleton)."""

from virtualpar.parallel import ParallelConfig
from virtualpar.parallel.plan import plan


def configure(model, batch, memory_bytes):
    fit, _ = plan(model, 8, "h100-node", batch=batch, capacity=memory_bytes)
    best = next(e for e in fit if (e.config.dp, e.config.tp, e.config.pp) == (2, 2, 2))
    return best.config


def bubble(schedule, pp, microbatches, virtual=2):
    chunks = virtual if schedule == "interleaved_1f1b" else 1
    return (pp - 1) / (chunks * microbatches + pp - 1)
