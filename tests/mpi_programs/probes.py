"""Probe and Iprobe: a message's source, tag and size before it is received, then received by the
receive the probe described.  Rank 1's sends come after rank 0 says go, so that what a probe can
find at each call is the same under any MPI."""
import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size


def show(*words):
    print(" ".join(map(str, (f"rank {rank}",) + words)), flush=True)  # one write: mpiexec never splits it


if rank == 0:
    st = MPI.Status()
    show("nothing yet", comm.Iprobe(source=1, tag=5, status=st), comm.iprobe(source=1))
    comm.send("go", dest=1, tag=1)  # rank 1 sends an array with tag 5, then an array with tag 6
    comm.Probe(source=1, tag=6, status=st)  # the later message first: the earlier stays ahead of it
    n = st.Get_count(MPI.DOUBLE)
    show("probed", st.Get_source(), st.Get_tag(), st.Get_count(), n)
    buf = np.empty(n)
    comm.Recv(buf, source=1, tag=6)
    st2 = MPI.Status()
    comm.Probe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st2)
    first = np.empty(st2.Get_count(MPI.DOUBLE))
    comm.Recv(first, source=st2.Get_source(), tag=st2.Get_tag())
    show("received", buf.tolist(), "then", st2.Get_tag(), first.tolist())
    show("PROC_NULL", comm.Iprobe(source=MPI.PROC_NULL, status=st), st.Get_source(), st.Get_tag(),
         st.Get_count())
    comm.send("go", dest=1, tag=1)  # rank 1 sends with tags 8 then 7
    while not comm.Iprobe(source=1, tag=7, status=st):
        time.sleep(0.001)
    show("polled", st.Get_tag(), st.Get_count(MPI.INT))
    a, b = np.zeros(4, np.int32), np.zeros(2, np.int32)
    comm.Recv(a, source=1, tag=MPI.ANY_TAG, status=st)  # the earliest: tag 8's
    comm.Recv(b, source=1, tag=7, status=st2)
    show("then", a.tolist(), st.Get_tag(), b.tolist(), st2.Get_tag())
    comm.send({"k": [1, 2, 3]}, dest=0, tag=11)  # a pickled object to itself: its size is its pickle's
    comm.Probe(source=0, tag=11, status=st)
    # (the same pickle: 29 bytes)
    show("object", st.Get_source(), st.Get_count(), comm.recv(source=0, tag=11))
elif rank == 1:
    comm.recv(source=0, tag=1)
    comm.Send(np.arange(3.0), dest=0, tag=5)
    comm.Send(np.arange(5.0) * 2, dest=0, tag=6)
    comm.recv(source=0, tag=1)
    comm.Send(np.arange(4, dtype=np.int32), dest=0, tag=8)
    comm.Send(np.arange(2, dtype=np.int32), dest=0, tag=7)
comm.Barrier()
show("done")
