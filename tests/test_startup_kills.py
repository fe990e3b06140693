"""A driver SIGKILLed at any moment of start-up leaves nothing, under fork, spawn and forkserver
(issue 43): no /dev/shm segment, no semaphore, no /tmp/pymp-* directory, no device process, and
the orphaned devices print no traceback.

The driver (tests/_startup_kill_driver.py) runs in a session of its own, so that every process it
started (devices, forkserver, resource tracker) can be found and waited for; TMPDIR points it at a
directory of this test, so its pymp-* directories are told from other programs'; its semaphores
carry its pid in their names.  One kill runs by default; the matrix is slow-marked.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_startup_kill_driver.py")
SETTLE = 30.0  # seconds the survivors (devices, forkserver, resource tracker) get to notice and clean


def _session(sid: int) -> list[int]:
    """Live processes of session ``sid`` (field 6 of /proc/<pid>/stat), zombies excluded."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp session
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(pid))
    return out


def _left(pid: int, tmpdir: str) -> list[str]:
    left = [f"/dev/shm/{e}" for e in os.listdir("/dev/shm")
            if e.startswith(f"virtualpar-{pid}-") or e.startswith(f"sem.vpk{pid}-")]
    return left + [os.path.join(tmpdir, e) for e in os.listdir(tmpdir)]


def _kill_during_start_up(start_method: str, point: str, tmp_path, delay: float = 0.0, n: int = 2) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(os.environ, TMPDIR=str(tmpdir), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, DRIVER, start_method, str(n), point], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "importing done"
        if point == "none":
            time.sleep(delay)
        else:
            line = proc.stdout.readline().strip()
            assert line == f"at {point}", line + proc.stderr.read()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + SETTLE
        while _session(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        survivors = _session(proc.pid)
        _, err = proc.communicate(timeout=10)  # every holder of the pipes is gone
    finally:
        for p in _session(proc.pid):
            os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    assert survivors == [], f"processes left after the driver died: {survivors}"
    assert _left(proc.pid, str(tmpdir)) == []
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_a_forkserver_driver_killed_while_its_devices_start_leaves_nothing(tmp_path):
    """The representative: a forkserver listener directory, named semaphores, an arena descriptor
    in flight and devices that find their driver gone, all at once."""
    _kill_during_start_up("forkserver", "started", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["arena", "bells", "started", "ready"])
@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_a_driver_killed_at_a_point_of_start_up_leaves_nothing(start_method, point, tmp_path):
    _kill_during_start_up(start_method, point, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_a_driver_killed_after_a_random_delay_leaves_nothing(start_method, seed, tmp_path):
    delay = random.Random(f"{start_method}-{seed}").uniform(0.0, 1.5)
    _kill_during_start_up(start_method, "none", tmp_path, delay=delay, n=4)
