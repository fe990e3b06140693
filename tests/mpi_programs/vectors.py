"""Alltoallv with uneven counts (and IN_PLACE), Sendrecv_replace around a ring, the TAG_UB and
WTIME_IS_GLOBAL attributes, Wtick, and a tag past TAG_UB refused."""
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size


def show(*words):
    print(" ".join(map(str, (f"rank {rank}",) + words)), flush=True)  # one write: mpiexec never splits it


# rank r sends j + 1 elements to rank j, valued 100 r + j; so it receives r + 1 from each
scounts = [j + 1 for j in range(size)]
sdispls = [sum(scounts[:j]) for j in range(size)]
send = np.concatenate([np.full(j + 1, 100.0 * rank + j) for j in range(size)])
rcounts = [rank + 1] * size
rdispls = [j * (rank + 2) for j in range(size)]  # with a gap of one after each piece
recv = np.full(size * (rank + 2), -1.0)
comm.Alltoallv([send, (scounts, sdispls), MPI.DOUBLE], [recv, (rcounts, rdispls), MPI.DOUBLE])
show("Alltoallv", recv.tolist())

# in place: the counts must match
inplace = np.concatenate([np.full(2, 10.0 * rank + j) for j in range(size)])
comm.Alltoallv(MPI.IN_PLACE, [inplace, ([2] * size, [2 * j for j in range(size)]), MPI.DOUBLE])
show("Alltoallv in place", inplace.tolist())

buf = np.arange(3.0) + 10 * rank
st = MPI.Status()
comm.Sendrecv_replace(buf, dest=(rank + 1) % size, sendtag=4, source=(rank - 1) % size, recvtag=4, status=st)
show("Sendrecv_replace", buf.tolist(), st.Get_source(), st.Get_tag(), st.Get_count(MPI.DOUBLE))

show("attrs", comm.Get_attr(MPI.TAG_UB), comm.Get_attr(MPI.WTIME_IS_GLOBAL), MPI.Wtick() > 0)
try:
    comm.send("x", dest=(rank + 1) % size, tag=comm.Get_attr(MPI.TAG_UB) + 1)
except Exception:
    show("a tag past TAG_UB is refused")
comm.send("ok", dest=(rank + 1) % size, tag=comm.Get_attr(MPI.TAG_UB))
show("TAG_UB itself", comm.recv(source=(rank - 1) % size, tag=comm.Get_attr(MPI.TAG_UB)))
