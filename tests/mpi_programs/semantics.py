"""mpi4py details a ported program meets: an isend's object is taken when posted, tags up to
MPICH's TAG_UB, statuses from Test/Waitall and from PROC_NULL, Wait's return value, keyword
arguments by mpi4py's names, a Sub of a cartesian communicator that can Shift, a scalar periods,
and a receive buffer that is not contiguous."""
from mpi4py import MPI
import numpy as np

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
right, left = (rank + 1) % size, (rank - 1) % size

a = np.full(4, 2.0)
req = comm.isend(a, dest=right, tag=2_000_001)
a[:] = 3.0  # after the post: the message holds 2.0
got = comm.recv(source=left, tag=2_000_001)
req.wait()
print(f"rank {rank} isend took {got.tolist()} tag ok", flush=True)

out, st = np.zeros(3), MPI.Status()
sreq = comm.Isend(np.arange(3.0) + rank, dest=right, tag=5)
rreq = comm.Irecv(out, source=left, tag=5)
while not rreq.Test(st):
    pass
print(f"rank {rank} Test status {st.Get_source()} {st.Get_tag()} {st.Get_count(MPI.DOUBLE)} Wait "
      f"{sreq.Wait()}", flush=True)

bufs = [np.zeros(2), np.zeros(2)]
reqs = [comm.Irecv(bufs[0], source=left, tag=6), comm.Irecv(bufs[1], source=left, tag=7),
        comm.Isend(np.full(2, rank + 0.5), dest=right, tag=6),
        comm.Isend(np.full(2, rank + 0.25), dest=right, tag=7)]
statuses = [MPI.Status() for _ in reqs]
done = MPI.Request.Waitall(reqs, statuses)
print(f"rank {rank} Waitall {done} tags {[s.Get_tag() for s in statuses[:2]]} {[b.tolist() for b in bufs]}",
      flush=True)

nothing = MPI.Status()
comm.Recv(np.zeros(1), source=MPI.PROC_NULL, status=nothing)
print(f"rank {rank} from PROC_NULL {nothing.Get_source() == MPI.PROC_NULL} "
      f"{nothing.Get_tag() == MPI.ANY_TAG} "
      f"{nothing.Get_count(MPI.DOUBLE)}", flush=True)
edge = comm.Create_cart([size], periods=[False])  # an open line: its ends' neighbours are PROC_NULL
print(f"rank {rank} open line {edge.Shift(0, 1)} from PROC_NULL {nothing.Get_source()} constants "
      f"{MPI.ANY_SOURCE} {MPI.ANY_TAG} {MPI.PROC_NULL}", flush=True)

part = comm.scatter(sendobj=[r * 10 for r in range(size)] if rank == 0 else None, root=0)
everyone = comm.gather(sendobj=part, root=0)
total = comm.allreduce(sendobj=part, op=MPI.SUM)
mixed = comm.alltoall(sendobj=[(rank, r) for r in range(size)])
print(f"rank {rank} keywords {part} {everyone} {total} {comm.allgather(sendobj=rank)} {mixed[0]} "
      f"{comm.reduce(sendobj=1, op=MPI.SUM, root=0)}", flush=True)

cart = comm.Create_cart([size], periods=True)
line = cart.Sub([True])
print(f"rank {rank} periods {cart.periods} Sub Shift {line.Shift(0, 1)}", flush=True)

grid = np.zeros((2, 4))
try:
    comm.Sendrecv(np.ones(4), dest=right, recvbuf=grid[:, :2], source=left)
except BufferError as exc:
    print(f"rank {rank} strided receive buffer: BufferError", flush=True)  # (refused before anything is sent)

# a Fortran-ordered buffer travels in memory order, as MPI sends bytes
sent = np.asfortranarray(np.arange(6.0).reshape(2, 3) + 10 * rank)
landed = np.zeros((3, 2), order="F")
comm.Sendrecv(sent, dest=right, recvbuf=landed, source=left)
column = np.zeros(6)
comm.Sendrecv(sent, dest=right, recvbuf=column, source=left)
print(f"rank {rank} Fortran order {landed.tolist()} {column.tolist()}", flush=True)
