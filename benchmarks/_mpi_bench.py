"""The mpi4py reference for bench_collectives.py; run under ``mpiexec -n N``; prints one JSON line."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from mpi4py import MPI

KIB, MIB = 1 << 10, 1 << 20


def main() -> None:
    quick = "--quick" in sys.argv
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    out: dict = {"devices": n}
    if n == 2:
        msg = np.ones(4 * KIB, np.uint8)
        iters = 50 if quick else 2000
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(iters):  # pickle-based lowercase send/recv, as the reference
            if rank == 0:
                comm.send(msg, 1)
                comm.recv(source=1)
            else:
                comm.recv(source=0)
                comm.send(msg, 0)
        out["latency_pickle_4KiB_s"] = (time.perf_counter() - t) / iters / 2
    sizes = [4 * KIB, 256 * KIB, 16 * MIB] if quick else [4 * KIB << (2 * i) for i in range(8)]
    out["allreduce_algbw_Bps"] = {}
    for nbytes in sizes:
        if nbytes < 4 * KIB * n:
            continue
        x = np.ones(nbytes // 4, np.float32)
        y = np.empty_like(x)
        iters = 2 if quick else max(3, min(200, (256 * MIB) // nbytes))
        comm.Allreduce(x, y)
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(iters):
            comm.Allreduce(x, y)
        elapsed = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
        out["allreduce_algbw_Bps"][str(nbytes)] = nbytes * iters / elapsed
    if rank == 0:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
