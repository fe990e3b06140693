"""Buffer specs with a count ([buf, 3, MPI.DOUBLE] sends 3 elements), and a receive buffer larger
than the message (MPI fills its start; Get_count says how much came)."""
from mpi4py import MPI
import numpy as np

comm = MPI.COMM_WORLD
if comm.rank == 0:
    comm.Send([np.arange(10.0), 3, MPI.DOUBLE], dest=1)
    comm.Send(np.arange(3.0), dest=1)
elif comm.rank == 1:
    a = np.zeros(3)
    comm.Recv([a, MPI.DOUBLE], source=0)
    b, st = np.zeros(8), MPI.Status()
    comm.Recv(b, source=0, status=st)
    print(f"rank 1 got {a.tolist()} then {b.tolist()} count {st.Get_count(MPI.DOUBLE)}", flush=True)
