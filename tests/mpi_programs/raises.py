"""A rank raises while the others wait for it in a barrier."""
from mpi4py import MPI

comm = MPI.COMM_WORLD
print(f"rank {comm.rank} started", flush=True)
if comm.rank == 1:
    raise ValueError("boom on 1")
comm.Barrier()
