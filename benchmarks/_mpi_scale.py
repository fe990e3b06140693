"""MPICH reference for ``bench_scale.py``; run as ``mpiexec -n N python _mpi_scale.py``.

The same measurements as the virtualpar side: for each op, the *first* call after start-up (and
after one untimed call of the timing allreduce, as there) and the *steady* time (best of the next
three), each the slowest rank's time, as the issue defines them.
Prints one JSON object on rank 0's last line.  Not imported by virtualpar.
"""

from __future__ import annotations

import json
import time

import numpy as np
from mpi4py import MPI

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
KIB = 1024


def _ops() -> dict:
    small, large = np.ones(8 * KIB // 8), np.ones(512 * KIB // 8)
    out_small, out_large = np.empty_like(small), np.empty_like(large)
    piece = large[: large.size // SIZE]
    # a 512 KiB result (less the remainder when SIZE does not divide it)
    gathered = np.empty(piece.size * SIZE)
    return {
        "barrier": lambda: COMM.Barrier(),
        "all_reduce_8KiB": lambda: COMM.Allreduce(small, out_small, op=MPI.SUM),
        "all_reduce_512KiB": lambda: COMM.Allreduce(large, out_large, op=MPI.SUM),
        "all_gather_512KiB": lambda: COMM.Allgather(piece, gathered),
        "broadcast_512KiB": lambda: COMM.Bcast(large, root=0),
    }


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return COMM.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def main() -> None:
    result = {"ranks": SIZE, "first_s": {}, "steady_s": {}}
    # the harness's first timing call, untimed, as bench_scale.py makes its own
    COMM.allreduce(0.0, op=MPI.MAX)
    for name, fn in _ops().items():
        result["first_s"][name] = _timed(fn)
        result["steady_s"][name] = min(_timed(fn) for _ in range(3))
    if RANK == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
