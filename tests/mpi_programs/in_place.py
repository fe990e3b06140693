"""MPI.IN_PLACE in every buffer collective that takes it: the root's (or every rank's) own piece
is already where the result puts it (Gather, Gatherv, Allgather, Allgatherv, Scatter), or the
input is the receive buffer (Alltoall, Reduce_scatter_block; Reduce and Allreduce)."""
from mpi4py import MPI
import numpy as np

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
mine = np.full(2, 10.0 * rank + 1)

got = np.zeros(2 * size)
if rank == 0:
    got[0:2] = mine
    comm.Gather(MPI.IN_PLACE, got, root=0)
    print(f"rank 0 Gather {got.tolist()}", flush=True)
else:
    comm.Gather(mine, None, root=0)

counts = [r + 1 for r in range(size)]
displs = [sum(counts[:r]) for r in range(size)]
every = np.zeros(sum(counts))
every[displs[rank]:displs[rank] + counts[rank]] = rank + 0.5
comm.Allgatherv(MPI.IN_PLACE, [every, counts, displs, MPI.DOUBLE])
print(f"rank {rank} Allgatherv {every.tolist()}", flush=True)

both = np.zeros(2 * size)
both[2 * rank:2 * rank + 2] = mine
comm.Allgather(MPI.IN_PLACE, both)
print(f"rank {rank} Allgather {both.tolist()}", flush=True)

rooted = np.zeros(sum(counts))
if rank == size - 1:
    rooted[displs[rank]:displs[rank] + counts[rank]] = 7.0
    comm.Gatherv(MPI.IN_PLACE, [rooted, counts, displs, MPI.DOUBLE], root=size - 1)
    print(f"rank {rank} Gatherv {rooted.tolist()}", flush=True)
else:
    comm.Gatherv(np.full(counts[rank], float(rank)), None, root=size - 1)

piece = np.full(2, -1.0)
if rank == 0:
    table = np.arange(2.0 * size)
    comm.Scatter(table, MPI.IN_PLACE, root=0)  # the root's piece stays where it is
    print(f"rank 0 Scatter kept {table[:2].tolist()}", flush=True)
else:
    comm.Scatter(None, piece, root=0)
    print(f"rank {rank} Scatter {piece.tolist()}", flush=True)

swap = np.array([100.0 * rank + r for r in range(size)])
comm.Alltoall(MPI.IN_PLACE, swap)
print(f"rank {rank} Alltoall {swap.tolist()}", flush=True)

block = np.arange(2.0 * size) + rank
comm.Reduce_scatter_block(MPI.IN_PLACE, block, op=MPI.SUM)
print(f"rank {rank} Reduce_scatter_block {block[:2].tolist()}", flush=True)

# displacements neither back to back nor increasing, and an empty piece
counts = [r % 3 for r in range(size)]
displs, end = [0] * size, 0
for r in reversed(range(size)):
    displs[r], end = end, end + counts[r] + 1
gapped = np.full(end, -1.0)
gapped[displs[rank]:displs[rank] + counts[rank]] = rank + 0.25
comm.Allgatherv(MPI.IN_PLACE, [gapped, (counts, displs), MPI.DOUBLE])
print(f"rank {rank} Allgatherv gapped {gapped.tolist()}", flush=True)

# [buf, count, type]: a collective's count is per rank; the buffers are longer than the collective
counted = np.full(2 * size + 3, -1.0)
counted[2 * rank:2 * rank + 2] = rank
comm.Allgather(MPI.IN_PLACE, [counted, 2, MPI.DOUBLE])
print(f"rank {rank} Allgather counted {counted.tolist()}", flush=True)
swapped = np.append(np.arange(2.0 * size) + 100 * rank, -1.0)
comm.Alltoall(MPI.IN_PLACE, [swapped, 2, MPI.DOUBLE])
print(f"rank {rank} Alltoall counted {swapped.tolist()}", flush=True)
blocks = np.append(np.arange(2.0 * size) + rank, [-1.0, -1.0])
comm.Reduce_scatter_block(MPI.IN_PLACE, [blocks, 2, MPI.DOUBLE], op=MPI.SUM)
print(f"rank {rank} Reduce_scatter_block counted {blocks.tolist()}", flush=True)
sent = np.append(np.arange(2.0 * size) * (rank + 1), -1.0)
mine = np.zeros(2)
# not in place: 2 per rank from the send buffer
comm.Reduce_scatter_block([sent, 2, MPI.DOUBLE], mine, op=MPI.SUM)
print(f"rank {rank} Reduce_scatter_block sent counted {mine.tolist()}", flush=True)
