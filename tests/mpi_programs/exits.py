"""An exit code, stderr, argv and an unsupported call."""
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
print(f"rank {comm.Get_rank()} argv {sys.argv[1:]}")
print(f"rank {comm.Get_rank()} to stderr", file=sys.stderr)
if "--unsupported" in sys.argv:
    comm.Ialltoallw()
sys.exit(3 if comm.Get_rank() == 1 else 0)
