"""Synchronous sends (ssend, issend, Ssend, Issend): safe when each receive is posted in time,
a pending Issend is not complete before its receive; with --unsafe, every rank ssends right before
it receives from the left, which only buffering would let through: a deadlock under any MPI."""
import sys

from mpi4py import MPI
import numpy as np

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
right, left = (rank + 1) % size, (rank - 1) % size

if "--unsafe" in sys.argv:
    comm.ssend(rank, dest=right)
    print(f"rank {rank} never gets here {comm.recv(source=left)}", flush=True)
    sys.exit(0)

if rank % 2 == 0:  # evens send first, odds receive first: safe for any size > 1 if even
    comm.ssend({"from": rank}, dest=right, tag=1)
    got = comm.recv(source=left, tag=1)
else:
    got = comm.recv(source=left, tag=1)
    comm.ssend({"from": rank}, dest=right, tag=1)
print(f"rank {rank} ssend ring got {got}", flush=True)

buf = np.zeros(3)
req = comm.Irecv(buf, source=left, tag=2)
comm.Ssend(np.full(3, float(rank)), dest=right, tag=2)
req.Wait()
print(f"rank {rank} Ssend got {buf.tolist()}", flush=True)

if rank == 0:
    pending = comm.Issend(np.arange(4.0), dest=1, tag=3)
    also = comm.issend("hello", dest=1, tag=4)
    comm.Barrier()
    early = (pending.Test(), also.Test())
    comm.Barrier()
    pending.Wait()
    also.wait()
    print(f"rank 0 issends done before their receives: {early}", flush=True)
else:
    comm.Barrier()
    comm.Barrier()
    if rank == 1:
        word = comm.recv(source=0, tag=4)  # the later one first
        arr = np.zeros(4)
        comm.Recv(arr, source=0, tag=3)
        print(f"rank 1 took {word} then {arr.tolist()}", flush=True)
