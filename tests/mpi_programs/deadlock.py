"""Two ranks each receive first: a classic deadlock."""
from mpi4py import MPI

comm = MPI.COMM_WORLD
other = 1 - comm.Get_rank()
comm.recv(source=other, tag=0)
comm.send("never", dest=other, tag=0)
