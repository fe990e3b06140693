"""A small driver program that the fault suite runs in a subprocess (Ctrl-C and SIGKILL of the driver).

    python tests/_driver_scripts.py START_METHOD N

It starts a cluster of N devices, prints ``pids <p0> <p1> ...`` and ``shm <name>``, and runs a
function that never returns (every device loops on barriers); device 0 prints ``running`` once the
run is under way, so the test knows the driver is blocked inside ``cluster.run``.  The test then
sends SIGINT (the driver must re-raise KeyboardInterrupt after reaping every device) or SIGKILL
(every device must notice that its driver is gone and exit by itself).
"""

from __future__ import annotations

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from virtualpar import VirtualCluster  # noqa: E402


def spin_forever(dev) -> None:
    """Every device blocks in barriers forever; device 0 announces the run once."""
    if dev.rank == 0:
        print("running", flush=True)
    while True:
        dev.barrier()
        time.sleep(0.01)


def main(start_method: str, n: int) -> None:
    # Python turns SIGINT into KeyboardInterrupt only if SIGINT was not ignored when it started; a
    # non-interactive shell starts background jobs (a test suite run with `&`) ignoring it, and
    # their children inherit that: install the handler an interactive driver has.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with VirtualCluster(n, start_method=start_method, timeout=60.0) as cluster:
        print("pids", *cluster.pids, flush=True)
        print("shm", cluster._arena.name, flush=True)
        cluster.run(spin_forever)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
