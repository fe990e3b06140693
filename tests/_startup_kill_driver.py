"""A driver that the start-up kill tests SIGKILL at a chosen point of ``VirtualCluster`` start-up.

    python tests/_startup_kill_driver.py START_METHOD N POINT

POINT is where the driver stops (prints ``at POINT`` and sleeps) for the test to kill it:

- ``arena``: the shared arena exists, nothing else;
- ``bells``: the doorbells' semaphores exist too, no process yet;
- ``started``: every device process was started, none has answered (spawn: they are importing);
- ``ready``: the cluster is up;
- ``none``: nowhere: the test kills the driver after a delay of its own.

The points are reached by wrapping the runtime's functions here, in the test's driver, so the
library carries no test hook.  Semaphores get a prefix naming this pid (``/vpk<pid>``), so the test
can tell ours from other programs' in /dev/shm.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from virtualpar import VirtualCluster  # noqa: E402
from virtualpar.runtime import cluster as cluster_module, startup  # noqa: E402


def _stop(point: str) -> None:
    print("at", point, flush=True)
    time.sleep(600)


def _instrument(point: str) -> None:
    if point == "arena":
        real_start = cluster_module.start_devices

        def start_devices(*args, **kwargs):
            _stop("arena")
            return real_start(*args, **kwargs)

        cluster_module.start_devices = start_devices
    elif point == "bells":
        real_spawn = startup._spawn

        def spawn(*args, **kwargs):
            _stop("bells")
            return real_spawn(*args, **kwargs)

        startup._spawn = spawn
    elif point == "started":
        real_start_all = startup._start_all

        def start_all(*args, **kwargs):
            real_start_all(*args, **kwargs)
            _stop("started")

        startup._start_all = start_all


def main(start_method: str, n: int, point: str) -> None:
    multiprocessing.current_process()._config["semprefix"] = f"/vpk{os.getpid()}"
    _instrument(point)
    print("importing done", flush=True)
    cluster = VirtualCluster(n, start_method=start_method, warm_up=False)
    if point == "ready":
        _stop("ready")
    time.sleep(600)
    cluster.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
