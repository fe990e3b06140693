"""``dev.comm_stream`` / ``dev.wait_comm_stream``: a second modelled stream beside the compute
stream, the same on the emulator and under mpiexec (checked against the α–β closed form)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from virtualpar import VirtualCluster
from virtualpar.sim import analytic
from virtualpar.sim.hardware import DeviceSpec, Hardware

from ._mpi import run_mpiexec
from .test_mpi_backend import _mpiexec, _results

A, B = 2e-6, 1e9
HW = Hardware.uniform(latency=A, bandwidth=B, device=DeviceSpec("d", {"float32": 1e9}, math.inf, math.inf))

PROGRAM = '''
import numpy as np

def step(dev):
    dev.compute(flops=1e6)                      # 1 ms on the compute stream
    with dev.comm_stream(since=0.0):            # beside it, from t = 0
        dev.all_reduce(np.ones(1000), algorithm="ring")
        inside = dev.clock
    after = dev.clock
    dev.compute(flops=1e6)
    joined = dev.wait_comm_stream()
    with dev.comm_stream():                     # from now: after the compute
        dev.all_reduce(np.ones(1000), algorithm="ring")
    return [round(t * 1e9) for t in (inside, after, joined, dev.clock)]
'''


def _program():
    namespace: dict = {}
    exec(PROGRAM, namespace)  # noqa: S102 - our own program, run on both backends
    return namespace["step"]


def test_the_stream_runs_beside_the_compute_and_joins_it():
    """4 devices: the ring all-reduce of 8000 bytes takes 6(α + 2000/β) = 24 µs from t = 0, while
    the compute stream is at 1 ms; joined after 2 ms of compute, the clock is 2 ms (the stream
    ended long before); the second all-reduce starts at 2 ms, and the run ends when it does: the
    device's clock after the run includes its stream."""
    ring = analytic.ring_all_reduce(4, 8000, A, B)
    with VirtualCluster(4, hardware=HW) as cluster:
        inside, after, joined, clock = zip(*cluster.run(_program()))
        final = cluster.clocks()
    assert inside == (round(ring * 1e9),) * 4 and after == (1_000_000,) * 4 and joined == (2_000_000,) * 4
    assert clock == (2_000_000,) * 4  # the compute stream's clock, the stream still running
    assert final == pytest.approx([2e-3 + ring] * 4, rel=1e-12)


def test_the_stream_gives_the_same_times_under_mpiexec(tmp_path):
    script = tmp_path / "streams.py"
    script.write_text(PROGRAM)
    cmd = ["run", f"{script}:step", "-n", "4", "--hardware", "h100-node"]
    emu = subprocess.run([sys.executable, "-m", "virtualpar", *cmd], capture_output=True, text=True,
                         timeout=120)
    assert emu.returncode == 0, emu.stderr
    assert _mpiexec() is not None, "mpiexec is not installed: pip install mpich"
    real = run_mpiexec([_mpiexec(), "-n", "4", sys.executable, "-m", "virtualpar", *cmd[:2], "--hardware",
                        "h100-node"], capture_output=True, text=True, timeout=120)
    assert real.returncode == 0, real.stderr
    assert _results(real.stdout) == _results(emu.stdout) and len(_results(emu.stdout)) == 4


def test_a_forgotten_stream_is_joined_when_the_run_ends():
    def fn(dev):
        with dev.comm_stream(since=dev.clock):
            dev.all_reduce(np.ones(10), algorithm="ring")
        return dev.clock

    with VirtualCluster(2, hardware=HW) as cluster:
        assert cluster.run(fn) == [0.0, 0.0]
        assert cluster.clocks() == pytest.approx([analytic.ring_all_reduce(2, 80, A, B)] * 2, rel=1e-12)
