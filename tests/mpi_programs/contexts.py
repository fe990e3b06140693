"""ANY_TAG within a communicator, Split and Dup contexts kept apart, and PROC_NULL in the
non-blocking calls (a non-periodic Cartesian shift), as a master/worker and a halo exchange do."""
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 0:  # a master takes any worker's message with any tag; the Barrier below is not one of them
    got = sorted(comm.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG) for _ in range(comm.size - 1))
    print(f"rank 0 took {got}", flush=True)
else:
    comm.send(100 * comm.rank, dest=0, tag=comm.rank)
comm.Barrier()
a, b = comm.Split(color=17), comm.Dup()
if comm.rank == 0:
    a.send("on a", dest=1)
    b.send("on b", dest=1)
elif comm.rank == 1:
    print(f"rank 1 b got {b.recv(source=0)} a got {a.recv(source=0)}", flush=True)
cart = comm.Create_cart([comm.size], periods=[False])
left, right = cart.Shift(0, 1)
out = cart.isend(cart.rank, dest=right, tag=1)
came = cart.irecv(source=left, tag=1).wait()
out.wait()
print(f"rank {comm.rank} halo from the left {came}", flush=True)
