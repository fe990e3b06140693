"""comm.Abort on one rank while the others wait for it: the job ends with its error code."""
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
print(f"rank {rank} started", flush=True)
if rank == 0:
    print("rank 0 gives up", file=sys.stderr, flush=True)
    comm.Abort(5)
comm.recv(source=0)  # never sent
