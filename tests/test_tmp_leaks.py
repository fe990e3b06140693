"""/tmp as the test suite found it (issue 43): stray multiprocessing directories are found by the
leak check, and mpiexec jobs started by the tests leave no MPICH topology file, aborted or not."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

from virtualpar.testing.leaks import Snapshot, tmp_leftovers

from ._mpi import private_env


@pytest.fixture
def tmpdir_here(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_stray_pymp_directory_is_a_leak_and_a_served_or_own_one_is_not(tmpdir_here, monkeypatch):
    from multiprocessing import process

    before = Snapshot.take()
    stray = tmpdir_here / "pymp-stray"
    stray.mkdir()
    (stray / "listener-x").write_text("")  # a socket file nobody serves any more: its driver was killed
    served = tmpdir_here / "pymp-served"
    served.mkdir()
    own = tmpdir_here / "pymp-own"
    own.mkdir()
    monkeypatch.setitem(process.current_process()._config, "tempdir", str(own))  # removed at our exit
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(served / "listener-y"))
        listener.listen()
        found = tmp_leftovers()
        assert str(stray) in found and str(served) not in found and str(own) not in found
        said = [line for line in Snapshot.take().new_since(before) if "temporary" in line]
        assert said == [f"temporary directory {stray} not removed (no live process serves its socket)"]
    assert str(served) in tmp_leftovers()  # once nobody serves it, it is stray too


def test_hydra_files_are_listed_only_when_asked(tmp_path):
    assert all("hydra_hwloc_xmlfile_" not in p for p in tmp_leftovers())
    assert {p for p in tmp_leftovers(hydra=True) if "hydra_hwloc_xmlfile_" in p} == \
        {os.path.join("/tmp", e) for e in os.listdir("/tmp") if e.startswith("hydra_hwloc_xmlfile_")}


# A job that ends normally: hydra writes its topology file as the ranks start either way (and an
# aborted job would leave MPICH's own /dev/shm segment besides)
JOB = "from mpi4py import MPI\nMPI.COMM_WORLD.Barrier()\n"


def _hydra_files_created(strace_log: str) -> list[str]:
    with open(strace_log) as f:
        return sorted(set(re.findall(r'"(/tmp/hydra_hwloc_xmlfile_\w+)", O_RDWR\|O_CREAT', f.read())))


def test_an_mpiexec_job_run_by_the_tests_writes_no_topology_file(tmp_path):
    """Traced, so that another session's jobs on this machine cannot confuse the count: without the
    private environment, hydra's proxy creates /tmp/hydra_hwloc_xmlfile_* (which an aborted job
    leaves behind); with it (tests/_mpi.py), it creates none, so none can be left."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = mpiexec if os.path.exists(mpiexec) else shutil.which("mpiexec")
    if mpiexec is None or shutil.which("strace") is None:
        pytest.skip("needs mpiexec and strace")
    script = tmp_path / "job.py"
    script.write_text(JOB)
    made = {}
    for how in ("plain", "private"):
        log = str(tmp_path / f"{how}.strace")
        env = dict(os.environ)
        if how == "private":
            (tmp_path / "private").mkdir()
            env = private_env(str(tmp_path / "private"))
        argv = ["strace", "-f", "-qq", "-e", "trace=openat", "-o", log,
                mpiexec, "-n", "2", sys.executable, str(script)]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        if done.returncode != 0 or not os.path.exists(log):
            pytest.skip(f"strace cannot trace here: {done.stderr[-200:]}")
        made[how] = _hydra_files_created(log)
        for path in made[how]:  # the control's own file, named by the trace: remove exactly that
            if os.path.exists(path):
                os.unlink(path)
    assert made["plain"], "the control run should show hydra writing its topology file"
    assert made["private"] == []
