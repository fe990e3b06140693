"""A 2×2 cluster one of whose devices dawdles after one of its fences: the shared-memory collectives'
tests that a device which moved on to another group does not refill its scratch while a peer
still reads it (their last fence's job)."""

from __future__ import annotations

import time

from virtualpar import Mesh, VirtualCluster


def slow_reader_cluster(monkeypatch, fence_number: int, seconds: float = 0.3,
                        rank: int = 0) -> VirtualCluster:
    """Mesh a=2 × b=2 (row groups {0, 1}, {2, 3} on "b"; columns {0, 2}, {1, 3} on "a"), forked
    after ``GroupComm.fence`` is patched so that device ``rank`` sleeps ``seconds`` after its
    ``fence_number``-th fence, and without the warm-up, whose fences would be the first counted."""
    from virtualpar.runtime.group_comm import GroupComm

    fence = GroupComm.fence
    seen = {"fences": 0}

    def slow_fence(self):
        fence(self)
        if self._core.rank == rank:
            seen["fences"] += 1
            if seen["fences"] == fence_number:
                time.sleep(seconds)

    monkeypatch.setattr(GroupComm, "fence", slow_fence)  # fork: the devices inherit the patch
    return VirtualCluster(Mesh({"a": 2, "b": 2}), start_method="fork", trace=False, warm_up=False)
