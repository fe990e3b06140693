"""mpi4py reference for ``bench_collectives.py``; run as ``mpiexec -n N python _mpi_bench.py ...``.

Measures, with the same methodology as the virtualpar side (reused buffers, warm-up, mean over an
adaptive number of iterations, median over repeats, the slowest rank for collectives):

* ``--p2p`` (ranks 0 and 1): one-way latency of the pickle-based ``comm.send``/``comm.recv`` of a
  numpy array (what a Python user writes first), and ``comm.Send``/``comm.Recv`` buffer bandwidth;
* ``Allreduce`` of float32 (sum) into a separate output buffer, for every size.

Prints one JSON object on rank 0's last line.  Not imported by virtualpar; mpi4py is never a
dependency of the core.
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np
from mpi4py import MPI

from _references import reference_parser  # this directory: the script runs as a file

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


def _iters(fn, budget: float, quick: bool) -> int:
    """Iterations so that one repeat takes about ``budget`` seconds; agreed by every rank."""
    if quick:
        return 1
    t0 = time.perf_counter()
    fn(1)
    t = COMM.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    return int(COMM.bcast(max(1, min(2000, int(budget / max(t, 1e-7))))))


def latency(nbytes: int, budget: float, repeats: int, quick: bool) -> float:
    x = np.full(nbytes, 1, np.uint8)

    def run(iters: int) -> float:
        COMM.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            if RANK == 0:
                COMM.send(x, dest=1)
                COMM.recv(source=1)
            elif RANK == 1:
                COMM.recv(source=0)
                COMM.send(x, dest=0)
        return (time.perf_counter() - t0) / iters / 2

    run(2)
    iters = _iters(run, budget, quick)
    return statistics.median(COMM.bcast(run(iters)) for _ in range(repeats))


def bandwidth(nbytes: int, budget: float, repeats: int, quick: bool) -> float:
    x, out, ack = np.full(nbytes, 1, np.uint8), np.empty(nbytes, np.uint8), np.zeros(1, np.uint8)

    def run(iters: int) -> float:
        COMM.Barrier()
        t0 = time.perf_counter()
        if RANK == 0:
            for _ in range(iters):
                COMM.Send(x, dest=1)
            COMM.Recv(ack, source=1)
        elif RANK == 1:
            for _ in range(iters):
                COMM.Recv(out, source=0)
            COMM.Send(ack, dest=0)
        return (time.perf_counter() - t0) / iters

    run(1)
    iters = _iters(run, budget, quick)
    return statistics.median(nbytes / COMM.bcast(run(iters)) / 1e9 for _ in range(repeats))


def allreduce(nbytes: int, budget: float, repeats: int, quick: bool) -> float:
    x = np.full(nbytes // 4, RANK + 1, np.float32)
    out = np.empty_like(x)

    def run(iters: int) -> float:
        COMM.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            COMM.Allreduce(x, out, op=MPI.SUM)
        return COMM.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX)

    run(1)
    iters = _iters(run, budget, quick)
    return statistics.median(nbytes / run(iters) / 1e9 for _ in range(repeats))


def main() -> None:
    args = reference_parser().parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    result: dict = {"ranks": SIZE, "mpi": MPI.Get_library_version().splitlines()[0].strip(),
                    "allreduce_GBps": {}}
    if args.p2p and SIZE >= 2:
        result["latency_4KiB_s"] = latency(4096, args.budget, args.repeats, args.quick)
        result["bandwidth_GBps"] = {str(s): bandwidth(s, args.budget, args.repeats,
                                                      args.quick) for s in sizes}
    for s in sizes:
        result["allreduce_GBps"][str(s)] = allreduce(s, args.budget, args.repeats, args.quick)
    if RANK == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
