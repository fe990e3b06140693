"""Two ranks each receive first: a classic deadlock."""
from mpi4py import MPI

comm = MPI.COMM_WORLD
other = 1 - comm.Get_rank()
print(f"rank {comm.Get_rank()} waits for {other}")  # shown although the run fails, as mpiexec shows it
comm.recv(source=other, tag=0)
comm.send("never", dest=other, tag=0)
