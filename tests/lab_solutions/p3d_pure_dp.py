"""Data parallelism only: simple, but not what the lab asks."""
from virtualpar.parallel import ParallelConfig


def configure(model, batch, memory_bytes):
    return ParallelConfig(dp=8, microbatches=1)


def bubble(schedule, pp, microbatches, virtual=2):
    return (pp - 1) / (microbatches + pp - 1)
