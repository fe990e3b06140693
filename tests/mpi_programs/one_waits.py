"""Rank 1 waits for a message rank 0 never sends; rank 0 prints and returns."""
from mpi4py import MPI

comm = MPI.COMM_WORLD
print(f"rank {comm.rank} started", flush=True)
if comm.rank == 1:
    comm.recv(source=0, tag=3)
