"""Every rank prints after a barrier; then rank 1 raises: the others have finished by then."""
from mpi4py import MPI

comm = MPI.COMM_WORLD
comm.Barrier()
print(f"rank {comm.rank} done", flush=True)
if comm.rank == 1:
    raise ValueError("boom after the barrier")
