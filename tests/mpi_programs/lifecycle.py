"""Names every mpi4py script may use besides communication: COMM_SELF, Is_initialized,
Is_finalized, Finalize, and hasattr on a name the communicator lacks."""
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
me = MPI.COMM_SELF
print(f"rank {rank} self size {me.Get_size()} rank {me.Get_rank()} sum {me.allreduce(rank + 1)}")
print(f"rank {rank} initialized {MPI.Is_initialized()} finalized {MPI.Is_finalized()}")
print(f"rank {rank} has no_such_call {hasattr(comm, 'no_such_call')} "
      f"{getattr(MPI, 'NO_SUCH_NAME', 'absent')}")
comm.Barrier()
MPI.Finalize()
print(f"rank {rank} finalized {MPI.Is_finalized()}")
