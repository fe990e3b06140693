"""Prints one line, sleeps a second, three times: its lines must show as they come, not at the end."""
import time

from mpi4py import MPI

rank = MPI.COMM_WORLD.Get_rank()
for i in range(3):
    print(f"rank {rank} tick {i}")
    time.sleep(1)
