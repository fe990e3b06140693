"""Both ranks receive first with mpi4py's default tag (any): a deadlock."""
from mpi4py import MPI

comm = MPI.COMM_WORLD
comm.recv(source=1 - comm.rank)
