"""In the spirit of the mpi4py tutorial: point to point, collectives on objects and buffers.
(Each line is one formatted string: mpiexec merges the ranks' output at write boundaries.)"""
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()

# point to point, pickled objects
if rank == 0:
    comm.send({"a": 7, "b": 3.14}, dest=1, tag=11)
elif rank == 1:
    print(f"rank 1 got {comm.recv(source=0, tag=11)}")

# point to point, buffers
if rank == 0:
    comm.Send([np.arange(5, dtype="d"), MPI.DOUBLE], dest=1, tag=77)
elif rank == 1:
    buf = np.empty(5, dtype="d")
    comm.Recv([buf, MPI.DOUBLE], source=0, tag=77)
    print(f"rank 1 buffer {buf.tolist()}")

# collectives on objects
data = comm.bcast({"key": [1, 2]} if rank == 0 else None, root=0)
gathered = comm.gather(rank ** 2, root=0)
total = comm.allreduce(rank + 1, op=MPI.SUM)
biggest = comm.allreduce(rank, op=MPI.MAX)
piece = comm.scatter([i * 10 for i in range(size)] if rank == 0 else None, root=0)
swapped = comm.alltoall([rank * 100 + j for j in range(size)])
print(f"rank {rank}: bcast {data} total {total} max {biggest} scatter {piece} alltoall {swapped}")
if rank == 0:
    print(f"gathered {gathered}")

# collectives on buffers
x = np.full(4, rank + 1.0)
y = np.empty(4)
comm.Allreduce(x, y, op=MPI.SUM)
z = np.full(3, float(rank))
comm.Allreduce(MPI.IN_PLACE, z, op=MPI.PROD)
everyone = np.empty(size * 2)
comm.Allgather(np.array([rank, -rank], dtype="d"), everyone)
part = np.empty(1)
comm.Reduce_scatter_block(np.arange(size, dtype="d") + rank, part, op=MPI.SUM)
print(f"rank {rank}: Allreduce {y.tolist()} inplace {z.tolist()} Allgather "
      f"{everyone.tolist()} rsb {part.tolist()}")

# sendrecv around a ring, any-source with a status
right, left = (rank + 1) % size, (rank - 1) % size
got = comm.sendrecv(rank, dest=right, source=left)
if rank == 0:
    st = MPI.Status()
    vals = sorted(comm.recv(source=MPI.ANY_SOURCE, tag=5, status=st) for _ in range(size - 1))
    print(f"rank 0 any-source {vals}")
else:
    comm.send(rank * 3, dest=0, tag=5)
print(f"rank {rank}: from the left {got}")

# split and a cartesian grid
sub = comm.Split(color=rank % 2, key=rank)
print(f"rank {rank}: sub rank {sub.Get_rank()} of {sub.Get_size()} sum {sub.allreduce(rank)}")
cart = comm.Create_cart([size], periods=[True])
lo, hi = cart.Shift(0, 1)
print(f"rank {rank}: cart shift {lo} {hi} coords {cart.Get_coords(cart.Get_rank())}")
dup = comm.Dup()
print(f"rank {rank}: dup sum {dup.allreduce(1)}")
comm.Barrier()
sys.exit(0)
