"""``virtualpar train`` under ``mpiexec``: every rank runs its own part of each step
(:class:`~virtualpar.parallel.spmd.SpmdTrainer` on an :class:`~virtualpar.mpi.MPIDevice`), and rank 0
gathers the figures (loss, clocks, memory, weights) and prints them as the emulated run does."""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from typing import Any

import numpy as np

__all__ = ["under_mpiexec", "train_mpi"]

_MPI_ENV = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def under_mpiexec() -> bool:
    """Whether this process was started by an MPI launcher (its rank is in the environment)."""
    return any(v in os.environ for v in _MPI_ENV)


def train_mpi(args: argparse.Namespace, s: dict[str, Any]) -> int:
    from ..errors import UsageError

    if args.save or args.resume:
        raise UsageError("--save and --resume are not supported under mpiexec: a checkpoint is written and "
                         "read by the emulator's driver, which mpiexec's ranks do not have; checkpoint a "
                         "run without mpiexec, or write the final weights with --weights FILE.npz")
    from mpi4py import MPI

    from ..mpi.device import MPIDevice, collect
    from ..parallel.spmd import SpmdTrainer, assemble
    from ._run_mpi import ABORT_GRACE, _unlink_job_segments
    from ._training import Report, synthetic_batch, weights_l2

    cfg = s["cfg"]
    comm = MPI.COMM_WORLD
    if comm.Get_size() != cfg.size:
        raise UsageError(f"mpiexec started {comm.Get_size()} ranks, but the configuration needs {cfg.size} "
                         f"({cfg.mesh()}); run mpiexec -n {cfg.size}")
    dev = MPIDevice(cfg.mesh(), hardware=s["hardware"], timeout=args.timeout)
    root = dev.rank == 0
    try:
        local = SpmdTrainer(s["trainer"], dev)
        report = Report(args, s) if root else None
        for k in range(args.steps):
            tokens, targets = synthetic_batch(k, s["batch"], s["seq"], s["model"].vocab, args.seed)
            t0, before = time.perf_counter(), dev.clock
            loss = local.step(tokens, targets)
            got = comm.gather((loss, before, dev.clock, time.perf_counter() - t0), root=0)
            if root:
                losses = [g[0] for g in got if g[0] is not None]
                modelled = max(g[2] for g in got) - max(g[1] for g in got)
                report.step(k, float(np.mean(losses)), max(g[3] for g in got), modelled)
        memory = comm.gather(local.memory(), root=0)
        parts = comm.gather(local.fetch(), root=0)
        events = collect(dev, None) if args.trace else None
        if root:
            extra: dict[str, Any] = {}
            weights = assemble(s["trainer"], cfg.mesh(), parts)
            extra["weights_l2"] = weights_l2(weights)
            if args.weights:
                np.savez(args.weights, **weights)
                extra["weights"] = args.weights
            if args.trace:
                extra["trace"] = events["trace"].write_chrome(args.trace)
            report.finish(memory, extra)
    except BaseException:  # the other ranks would wait for this one forever: abort the job, saying who
        print(f"virtualpar train: {dev.name} raised:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        _unlink_job_segments()
        time.sleep(ABORT_GRACE)
        comm.Abort(1)
        return 1
    return 0
