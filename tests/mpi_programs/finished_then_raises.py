"""Every rank prints after a barrier; then rank 1 raises, once the others have finished.

A second barrier makes sure every rank has printed before rank 1 raises (after the first barrier
alone rank 1 could leave while rank 3 still waited for the root's message, and the abort then
stopped rank 3 before it printed: a flaky test).  Rank 1 then waits a moment, so that the others
have usually returned from the script by the time it raises: their output must come back with
the run that failed.  (Where one is still in the second barrier, it is stopped there and writes
what it printed itself: the same lines either way.)
"""
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
comm.Barrier()
print(f"rank {comm.rank} done", flush=True)
comm.Barrier()
if comm.rank == 1:
    time.sleep(0.2)
    raise ValueError("boom after the barrier")
