"""The fastest 3D configuration when memory is no object, whatever the budget; and an interleaved
bubble that forgets the chunks."""
from virtualpar.parallel import ParallelConfig
from virtualpar.parallel.plan import plan


def configure(model, batch, memory_bytes):
    fit, _ = plan(model, 8, "h100-node", batch=batch)
    return next(e.config for e in fit if (e.config.dp, e.config.tp, e.config.pp) == (2, 2, 2))


def bubble(schedule, pp, microbatches, virtual=2):
    return (pp - 1) / (microbatches + pp - 1)
