"""Prefix reductions (scan, exscan, Scan, Exscan, IN_PLACE too) and freeing the communicators a
program made (Split, Dup, Create_cart): the same output as under mpiexec."""
from mpi4py import MPI
import numpy as np

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size

print(f"rank {rank} scan {comm.scan(rank + 1)} exscan {comm.exscan(rank + 1)}", flush=True)
print(f"rank {rank} scan max {comm.scan(rank % 3, op=MPI.MAX)} exscan prod "
      f"{comm.exscan(rank + 2, op=MPI.PROD)}",
      flush=True)
print(f"rank {rank} scan list {comm.scan([rank])}", flush=True)  # + on lists concatenates, in rank order

x = np.array([rank + 1.0, 10.0 * rank])
out = np.zeros(2)
comm.Scan(x, out, op=MPI.SUM)
print(f"rank {rank} Scan {out.tolist()}", flush=True)
ex = np.full(2, -1.0)
comm.Exscan(x, ex, op=MPI.SUM)
print(f"rank {rank} Exscan {ex.tolist() if rank else 'rank 0 untouched ' + str(ex.tolist())}", flush=True)
inplace = np.array([rank + 1], dtype=np.int64)
comm.Scan(MPI.IN_PLACE, inplace, op=MPI.PROD)
print(f"rank {rank} Scan in place {inplace.tolist()}", flush=True)

half = comm.Split(rank % 2, rank)
dup = half.Dup()
print(f"rank {rank} half scan {dup.scan(rank)}", flush=True)
dup.Free()
half.Free()
cart = comm.Create_cart([size], periods=[True])
print(f"rank {rank} cart shift {cart.Shift(0, 1)}", flush=True)
cart.Free()
try:
    comm.Free()
except Exception:
    print(f"rank {rank} COMM_WORLD cannot be freed", flush=True)
