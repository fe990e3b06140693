"""Completing several requests: Waitany, Waitsome, Testany, Testall and their lower-case twins;
a completed request is inactive (REQUEST_NULL) from then on.  Rank 1's sends come in stages, each
after rank 0 says go, so that what can complete at each call is the same under any MPI."""
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size


def show(*words):
    print(" ".join(map(str, (f"rank {rank}",) + words)), flush=True)  # one write: mpiexec never splits it


if rank == 0:
    reqs = [comm.irecv(source=1, tag=t) for t in (5, 6, 7)]
    st = MPI.Status()
    i, v = MPI.Request.waitany(reqs, st)  # blocks: rank 1 sends tag 6 after a pause
    show("waitany", i, v, st.Get_source(), st.Get_tag(), reqs[i] == MPI.REQUEST_NULL, bool(reqs[0]))
    show("wait again", reqs[i].wait(st), st.Get_source(), st.Get_tag())
    show("testany", MPI.Request.testany(reqs), MPI.Request.Testany(reqs), "testall",
         MPI.Request.testall(reqs), "testsome", MPI.Request.testsome(reqs), MPI.Request.Testsome(reqs))
    statuses = []
    show("Testall", MPI.Request.Testall(reqs, statuses), len(statuses))
    comm.send("go", dest=1, tag=1)  # rank 1 sends tag 7
    idx, vals = MPI.Request.waitsome(reqs, statuses)
    show("waitsome", idx, vals, [(s.Get_source(), s.Get_tag()) for s in statuses[: len(idx)]])
    comm.send("go", dest=1, tag=1)  # rank 1 sends tag 5
    show("waitall", MPI.Request.waitall(reqs), [bool(r) for r in reqs])
    show("all inactive", MPI.Request.testany(reqs), MPI.Request.waitany(reqs), MPI.Request.Waitany(reqs),
         MPI.Request.waitsome(reqs), MPI.Request.testsome(reqs), MPI.Request.Testall(reqs), MPI.UNDEFINED)
    show("null", MPI.Request.waitall([MPI.REQUEST_NULL]), MPI.Request.testany([MPI.REQUEST_NULL]),
         MPI.REQUEST_NULL == MPI.REQUEST_NULL, bool(MPI.REQUEST_NULL))
    nowhere = comm.isend("lost", dest=MPI.PROC_NULL)
    show("PROC_NULL", MPI.Request.testany([nowhere]), MPI.Request.testany([nowhere]))
    buf = [comm.irecv(source=1, tag=8), comm.irecv(source=1, tag=9)]
    comm.send("go", dest=1, tag=1)  # rank 1 sends tags 8 and 9
    got = []
    while len(got) < 2:
        k, flag, obj = MPI.Request.testany(buf)
        if flag:
            got.append((k, obj))
        else:
            time.sleep(0.001)
    show("polled", sorted(got), MPI.Request.Waitsome(buf))
elif rank == 1:
    time.sleep(0.2)
    comm.send("six", dest=0, tag=6)
    comm.recv(source=0, tag=1)
    comm.send("seven", dest=0, tag=7)
    comm.recv(source=0, tag=1)
    comm.send("five", dest=0, tag=5)
    comm.recv(source=0, tag=1)
    comm.send(8, dest=0, tag=8)
    comm.send(9, dest=0, tag=9)
reqs = [comm.isend(rank, dest=(rank + 1) % size), comm.irecv(source=(rank - 1) % size)]
show("ring", MPI.Request.waitall(reqs))
