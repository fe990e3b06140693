"""The mpi4py tutorial's buffer examples, unmodified in spirit: Bcast, Scatter, Gather, a Reduce
computing pi, a matrix-vector product by Allgather, non-blocking exchanges, the v-variants and a
2-D cartesian grid.  (Each line is one formatted string, as mpiexec merges output per write.)"""
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()

# Bcast of a numpy array
data = np.arange(100, dtype="i") if rank == 0 else np.empty(100, dtype="i")
comm.Bcast(data, root=0)
print(f"rank {rank}: Bcast ok {bool((data == np.arange(100)).all())}")

# Scatter and Gather of buffers
send = np.arange(size * 3, dtype="d").reshape(size, 3) if rank == 0 else None
recv = np.empty(3, dtype="d")
comm.Scatter(send, recv, root=0)
back = np.empty((size, 3), dtype="d") if rank == 0 else None
comm.Gather(recv * 2, back, root=0)
print(f"rank {rank}: Scatter {recv.tolist()}")
if rank == 0:
    print(f"gathered doubled {back.ravel().tolist()}")

# pi by the midpoint rule, Reduce to rank 0
n = 1000
h = 1.0 / n
s = sum(4.0 / (1.0 + (h * (i + 0.5)) ** 2) for i in range(rank, n, size))
mypi = np.array(s * h, dtype="d")
pi = np.array(0.0, dtype="d")
comm.Reduce([mypi, MPI.DOUBLE], [pi, MPI.DOUBLE], op=MPI.SUM, root=0)
if rank == 0:
    print(f"gathered pi {pi.item():.12f}")

# matrix-vector product: each rank holds rows of A and a piece of x; Allgather assembles x
m = 2
A = np.arange(size * m * size * m, dtype="d").reshape(size * m, size * m)[rank * m:(rank + 1) * m]
x_local = np.arange(rank * m, (rank + 1) * m, dtype="d")
x = np.empty(size * m, dtype="d")
comm.Allgather([x_local, MPI.DOUBLE], [x, MPI.DOUBLE])
print(f"rank {rank}: matvec {(A @ x).tolist()}")

# non-blocking exchange around the ring, Waitall; Test on a finished request; Status counts
right, left = (rank + 1) % size, (rank - 1) % size
out, inn = np.full(4, float(rank)), np.empty(4)
reqs = [comm.Isend([out, MPI.DOUBLE], dest=right, tag=9), comm.Irecv([inn, MPI.DOUBLE], source=left, tag=9)]
MPI.Request.Waitall(reqs)
st = MPI.Status()
req = comm.irecv(source=left, tag=10)
comm.send(f"hello from {rank}", dest=right, tag=10)
msg = req.wait(status=st)
print(f"rank {rank}: Isend/Irecv {inn.tolist()} irecv {msg!r} from {st.Get_source()} tag {st.Get_tag()}")

# v-variants: rank r contributes r + 1 values
mine = np.full(rank + 1, float(rank))
counts = [r + 1 for r in range(size)]
allv = np.empty(sum(counts))
comm.Allgatherv(mine, [allv, counts])
gv = np.empty(sum(counts)) if rank == 0 else None
comm.Gatherv(mine, [gv, counts] if rank == 0 else None, root=0)
sv = np.empty(rank + 1)
comm.Scatterv([np.arange(sum(counts), dtype="d"), counts] if rank == 0 else None, sv, root=0)
print(f"rank {rank}: Allgatherv {allv.tolist()} Scatterv {sv.tolist()}")
if rank == 0:
    print(f"gathered v {gv.tolist()}")

# Alltoall of buffers
a2a = np.empty(size, dtype="d")
comm.Alltoall(np.arange(size, dtype="d") + 10 * rank, a2a)
print(f"rank {rank}: Alltoall {a2a.tolist()}")

# a 2-D grid (2 x size/2), rows and columns by Sub
if size % 2 == 0:
    cart = comm.Create_cart([2, size // 2], periods=[False, True])
    row, col = cart.Sub([False, True]), cart.Sub([True, False])
    print(f"rank {rank}: grid {cart.Get_coords(cart.Get_rank())} row sum {row.allreduce(rank)} "
          f"col sum {col.allreduce(rank)} shift {cart.Shift(1, 1)}")
t0 = MPI.Wtime()
comm.Barrier()
print(f"rank {rank}: Wtime advances {MPI.Wtime() >= t0}")
