"""Device functions for tests/test_deadlock.py (module level, so that they pickle)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def recv_first(dev: Any) -> None:
    """Both devices receive before they send: the textbook deadlock."""
    peer = 1 - dev.rank
    dev.recv(peer, tag=0)
    dev.send(np.zeros(3), peer, tag=0)


def collective_vs_recv(dev: Any) -> None:
    """Devices 0 and 1 enter an all_reduce over everybody; device 2 first waits for device 0."""
    if dev.rank == 2:
        dev.recv(0, tag=5)
    dev.all_reduce(np.ones(4), group=("x",))


def criss_cross(dev: Any) -> None:
    """A 3-stage pipeline whose stages receive in the wrong order: each waits for the next stage's
    gradient before sending its activation forward (stage 0 waits for stage 1's tag 1, stage 1 for
    stage 2's, stage 2 for stage 1's activation)."""
    r, n = dev.rank, dev.size
    if r < n - 1:
        dev.recv(r + 1, tag=1)  # the backward message, too early
        dev.send(np.ones(2), r + 1, tag=0)
    if r > 0:
        dev.recv(r - 1, tag=0)
        dev.send(np.ones(2), r - 1, tag=1)


def ring_exchange(dev: Any, nbytes: int) -> float:
    """Every device sends to its right neighbour, then receives from its left one (MPI's unsafe ring)."""
    n = dev.size
    x = np.full(nbytes // 8, float(dev.rank))
    dev.send(x, (dev.rank + 1) % n, tag=3)
    return float(dev.recv((dev.rank - 1) % n, tag=3)[0])


def wait_for_returned(dev: Any) -> None:
    """Device 1 returns at once; device 0 waits for a message it will never send."""
    if dev.rank == 0:
        dev.recv(1, tag=9)


def slow_sender(dev: Any, seconds: float) -> float:
    """Device 0 computes (sleeps) before it sends: its peer waits, but nothing is deadlocked."""
    import time

    if dev.rank == 0:
        time.sleep(seconds)
        dev.send(np.arange(3.0), 1, tag=0)
        return 0.0
    return float(dev.recv(0, tag=0).sum())


def safe_ring(dev: Any, nbytes: int) -> float:
    """The safe ring: post the receive first (irecv), then send, then wait."""
    n = dev.size
    req = dev.irecv((dev.rank - 1) % n, tag=3)
    dev.send(np.full(nbytes // 8, float(dev.rank)), (dev.rank + 1) % n, tag=3)
    return float(req.wait()[0])


def collectives(dev: Any, algorithm: str) -> list[np.ndarray]:
    x = np.arange(12.0) + 100 * dev.rank
    return [dev.all_reduce(x, algorithm=algorithm), dev.all_gather(x, 0), dev.broadcast(x, 1)]


def first_ready(dev: Any) -> int:
    """A race: device 0 takes whichever of devices 1 and 2 sent first (an ANY_SOURCE receive)."""
    from virtualpar import ANY_SOURCE, Status

    if dev.rank == 0:
        st = Status()
        dev.recv(ANY_SOURCE, 0, status=st)
        dev.recv(ANY_SOURCE, 0)
        return st.source
    dev.send(np.array([dev.rank]), 0, tag=0)
    return dev.rank


def shm_all_reduce(dev: Any, n: int, algorithm: str) -> float:
    return float(dev.all_reduce(np.ones(n), algorithm=algorithm)[0])


def one_send(dev: Any) -> None:
    if dev.rank == 0:
        dev.send(np.zeros(2), 1, tag=4)
    else:
        dev.recv(0, tag=4)


def fail_at_once(dev: Any) -> None:
    raise ValueError("bad input")


def busy_mix(dev: Any, rounds: int) -> float:
    """Rings of messages, collectives over sub-groups and uneven compute, many times over: a lot of
    sleeping waits with messages in flight, none of them a deadlock."""
    import time

    n, r = dev.size, dev.rank
    total = 0.0
    for k in range(rounds):
        req = dev.irecv((r - 1) % n, tag=k)
        dev.send(np.full(64, float(r + k)), (r + 1) % n, tag=k)
        total += float(req.wait()[0])
        if (r + k) % 3 == 0:
            time.sleep(0.002)  # a device in its own code: its peers sleep, nothing is stuck
        total += float(dev.all_reduce(np.ones(1000), group=("a",))[0])
        total += float(dev.all_reduce(np.ones(8))[0])
    return total


def any_source_order(dev):
    """Every other device sends before a barrier; device 0 then takes them with ANY_SOURCE: the
    order it gets is the delivery order of ready messages from different sources."""
    from virtualpar import ANY_SOURCE, Status

    if dev.rank != 0:
        dev.send(np.array([dev.rank]), 0, tag=3)
        dev.barrier()
        return None
    dev.barrier()  # every message has been sent (eagerly) before anyone passes the barrier
    order = []
    for _ in range(dev.size - 1):
        st = Status()
        dev.recv(ANY_SOURCE, 3, status=st)
        order.append(st.source)
    return tuple(order)


def recv_any_tag_first(dev: Any, any_source: bool) -> None:
    """Both devices receive first, with any tag (mpi4py's default for ``comm.recv(source=...)``)."""
    from virtualpar import ANY_SOURCE, ANY_TAG
    dev.recv(ANY_SOURCE if any_source else 1 - dev.rank, tag=ANY_TAG)
    dev.send(np.zeros(3), 1 - dev.rank, tag=0)


def slow_sender_any_tag(dev: Any, seconds: float) -> float:
    """Device 1 waits with any tag while device 0 computes, then sends with tag 7: not a deadlock."""
    from virtualpar import ANY_TAG
    if dev.rank == 0:
        time.sleep(seconds)
        dev.send(np.full(1, 3.0), 1, tag=7)
        return 0.0
    return float(dev.recv(0, tag=ANY_TAG)[0])


def wait_any_first(dev: Any) -> None:
    """Both devices wait for any of two receives from the other before either sends."""
    peer = 1 - dev.rank
    reqs = [dev.irecv(peer, tag=1), dev.irecv(peer, tag=2)]
    dev.wait_any(reqs)
    dev.send(np.zeros(3), peer, tag=1)


def wait_any_slow_sender(dev: Any, seconds: float) -> float:
    """Device 1 waits for any of two receives while device 0 computes, then sends one: not a deadlock."""
    if dev.rank == 0:
        time.sleep(seconds)
        dev.send(np.full(1, 3.0), 1, tag=2)
        dev.send(np.full(1, 4.0), 1, tag=1)
        return 0.0
    reqs = [dev.irecv(0, tag=1), dev.irecv(0, tag=2)]
    k = dev.wait_any(reqs)
    return float(reqs[k].wait()[0]) + 10 * float(reqs[1 - k].wait()[0])


def probe_first(dev: Any) -> None:
    """Both devices probe for the other's message before either sends."""
    dev.probe(1 - dev.rank)
    dev.send(np.zeros(3), 1 - dev.rank, tag=1)
