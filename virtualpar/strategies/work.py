"""Every training strategy as two functions of a unit of work (the work → worker scheme).

A unit of ``Work`` is one stage of one batch in one direction.  A strategy maps it to
``ComputeAndWeightWorkers``: the worker that computes it and the worker that stores the weights
it needs.  When the two differ, the weights travel to the compute worker (and, for a backward,
the gradients travel back), as in FSDP.  The built-in strategies are the notebook's, each a few
lines: data parallelism gives every batch its own worker; pipeline parallelism gives every stage
its own worker; the looped variants give each batch a group of ``group_size`` workers that it
loops over when the model has more stages than the group.
"""

from __future__ import annotations

from enum import Enum
from typing import Callable, NamedTuple

from ..errors import UsageError

__all__ = ["Direction", "Work", "ComputeAndWeightWorkers", "Strategy", "DistributedDataParallel",
           "FullyShardedDataParallel", "GPipe", "LoopedPipeline", "FullyShardedLoopedPipeline", "Cuckoo",
           "STRATEGIES", "default_group_size"]


class Direction(Enum):
    """Which pass a unit of work is: ``FORWARD`` (``"f"``) or ``BACKWARD`` (``"b"``)."""

    FORWARD = "f"
    BACKWARD = "b"


class Work(NamedTuple):
    """One unit of work: stage ``stage`` of batch ``batch`` in ``direction``; ``str()`` gives ``f2`` /
    ``b2``."""

    stage: int
    batch: int
    direction: Direction

    def __str__(self) -> str:
        return f"{self.direction.value}{self.stage}"


class ComputeAndWeightWorkers(NamedTuple):
    """Where a strategy puts a unit of work: ``compute``, the worker that runs it, and ``weight``, the worker
    that stores its stage's weights (when they differ, the weights travel to ``compute``)."""

    compute: int
    weight: int


#: A strategy: maps each unit of ``Work`` to the ``ComputeAndWeightWorkers`` that compute it and
#: store its weights.
Strategy = Callable[[Work], ComputeAndWeightWorkers]


def DistributedDataParallel(w: Work) -> ComputeAndWeightWorkers:
    """Batch b on worker b, which also keeps a full copy of the weights."""
    return ComputeAndWeightWorkers(w.batch, w.batch)


def FullyShardedDataParallel(num_workers: int) -> Strategy:
    """Batch b on worker b; stage s's weights stored once, on worker s mod W."""
    def fsdp(w: Work) -> ComputeAndWeightWorkers:
        return ComputeAndWeightWorkers(w.batch, w.stage % num_workers)
    return fsdp


def GPipe(w: Work) -> ComputeAndWeightWorkers:
    """Stage s on worker s, with its weights (order the work OldestBatchFirst or OldestStageFirst)."""
    return ComputeAndWeightWorkers(w.stage, w.stage)


def _looped(group_size: int, num_workers: int, x: int, y: int) -> int:
    return (group_size * y) % num_workers + x % group_size


def _check_group(name: str, group_size: int, num_workers: int) -> None:
    """The groups tile the workers only if ``group_size`` divides W (group g·b mod W would run past
    worker W−1 otherwise)."""
    if isinstance(group_size, bool) or not isinstance(group_size,
                                                      int) or group_size < 1 or num_workers % group_size:
        divisors = [d for d in range(1, num_workers + 1) if num_workers % d == 0]
        raise UsageError(f"{name}: group_size={group_size!r} must divide the {num_workers} workers "
                         f"into equal groups; choose one of {divisors}")


def default_group_size(num_workers: int) -> int:
    """The looped strategies' default: the largest divisor of W that is at most W/2 (two or more
    groups), or 1."""
    return max([d for d in range(1, num_workers // 2 + 1) if num_workers % d == 0], default=1)


def LoopedPipeline(group_size: int, num_workers: int) -> Strategy:
    """Batch b runs on the group of workers starting at group_size·b mod W; stage s on member s mod
    group_size (``group_size`` must divide W)."""
    _check_group("LoopedPipeline", group_size, num_workers)

    def looped(w: Work) -> ComputeAndWeightWorkers:
        worker = _looped(group_size, num_workers, w.stage, w.batch)
        return ComputeAndWeightWorkers(worker, worker)
    return looped


def FullyShardedLoopedPipeline(group_size: int, num_workers: int) -> Strategy:
    """Looped compute; stage s's weights stored on the worker the looped map gives (stage, stage)."""
    _check_group("FullyShardedLoopedPipeline", group_size, num_workers)

    def fs_looped(w: Work) -> ComputeAndWeightWorkers:
        return ComputeAndWeightWorkers(_looped(group_size, num_workers, w.stage, w.batch),
                                       _looped(group_size, num_workers, w.stage, w.stage))
    return fs_looped


def Cuckoo(num_workers: int, num_stages: int, num_batches: int) -> Strategy:
    """GPipe, except that the backward of the early stages of the early batches is computed on the
    mirror worker W−1−s (which must keep their input activations meanwhile), weights unmoved."""
    def cuckoo(w: Work) -> ComputeAndWeightWorkers:
        if (
            w.direction is Direction.BACKWARD
            and w.stage < num_stages // 2 + 2
            and w.batch < num_batches // 2 - 2
        ):
            return ComputeAndWeightWorkers(num_workers - w.stage - 1, w.stage)
        return ComputeAndWeightWorkers(w.stage, w.stage)
    return cuckoo


def _stage_per_worker(name: str, num_workers: int, num_stages: int, strategy: Strategy) -> Strategy:
    """A strategy that puts stage s on worker s needs a worker per stage."""
    if num_workers < num_stages:
        raise UsageError(f"{name} puts stage s on worker s, so it needs at least as many workers as stages; "
                         f"got {num_workers} workers for {num_stages} stages")
    return strategy


def _modulo(strategy: Strategy, num_workers: int) -> Strategy:
    """More batches than workers: batch b runs where batch b mod W would (workers take turns)."""
    def wrapped(w: Work) -> ComputeAndWeightWorkers:
        return strategy(Work(w.stage, w.batch % num_workers, w.direction))
    return wrapped


#: name -> factory(workers, stages, batches, group_size) -> strategy; unknown names raise KeyError.
STRATEGIES: dict[str, Callable[..., Strategy]] = {
    "ddp": lambda W, S, B, g=None: DistributedDataParallel if B <= W else _modulo(DistributedDataParallel, W),
    "fsdp": lambda W, S, B,
    g=None: FullyShardedDataParallel(W) if B <= W else _modulo(FullyShardedDataParallel(W), W),
    "gpipe": lambda W, S, B, g=None: _stage_per_worker("gpipe", W, S, GPipe),
    "looped": lambda W, S, B, g=None: LoopedPipeline(default_group_size(W) if g is None else g, W),
    "fs_looped": lambda W, S, B,
    g=None: FullyShardedLoopedPipeline(default_group_size(W) if g is None else g, W),
    "cuckoo": lambda W, S, B, g=None: _stage_per_worker("cuckoo", W, S, Cuckoo(W, S, B)),
}
