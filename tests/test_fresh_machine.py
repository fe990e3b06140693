"""What a new user meets first (issue 38): a light ``import virtualpar``, commands piped into a
reader that stops early, the platform, and ``run -n`` on a function that names a mesh axis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from virtualpar import UsageError, VirtualCluster

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
HEAVY = ("scipy", "autograd", "matplotlib", "mpi4py", "virtualpar.nn")


def test_import_virtualpar_leaves_the_heavy_packages_unloaded():
    """The core (clusters, meshes, collectives) does not pay for nn's autograd and scipy, the
    viz extra's matplotlib or the mpi extra's mpi4py: each loads when its feature is first used."""
    code = f"import sys, json, virtualpar\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == []
    # and the check itself can fail: importing nn does load autograd and scipy
    code = f"import sys, json, virtualpar.nn\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert {"scipy", "autograd", "virtualpar.nn"} <= set(json.loads(got.stdout))


@pytest.mark.parametrize("argv", [["schedule", "gpipe", "--microbatches", "64"], ["--help"],
                                  ["schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--json"]])
def test_a_command_piped_into_a_closed_reader_ends_quietly(argv):
    """``virtualpar schedule gpipe --microbatches 64 | head -1`` ended in a BrokenPipeError
    traceback.  The reader here is gone before the first write, so every write fails."""
    read, write = os.pipe()
    os.close(read)
    try:
        got = subprocess.run([sys.executable, "-m", "virtualpar", *argv], stdout=write,
                             stderr=subprocess.PIPE, text=True, env=ENV, timeout=120)
    finally:
        os.close(write)
    # argparse prints --help itself: Python 3.11.2's argparse let the BrokenPipeError out of parse_args
    assert got.returncode in ((0, 1) if argv == ["--help"] else (1,)) and got.stderr == "", got.stderr


def test_head_reads_the_first_line_and_the_command_exits_without_a_traceback():
    got = subprocess.run(f'"{sys.executable}" -m virtualpar schedule gpipe --microbatches 64 | head -1',
                         shell=True, capture_output=True, text=True, env=ENV, timeout=120)
    assert got.stdout.startswith("gpipe: 4 ranks, 4 stages, 64 microbatches")
    assert got.stdout.count("\n") == 1 and "Traceback" not in got.stderr and "BrokenPipe" not in got.stderr


def test_starting_a_cluster_off_linux_is_refused_before_anything_is_allocated(monkeypatch):
    import virtualpar.runtime.cluster as cluster_module

    def no_arena(*args, **kwargs):
        raise AssertionError("allocated shared memory before checking the platform")

    monkeypatch.setattr(cluster_module, "SharedArena", no_arena)
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(UsageError, match=r"Linux only.*/dev/shm.*process_vm_readv.*'darwin'"):
        VirtualCluster(2)


_STEP = textwrap.dedent("""\
    import numpy as np

    def step(dev):
        return float(dev.all_reduce(np.full(4, dev.index.tp + 1.0), group="tp")[0])
    """)


def test_run_with_n_names_the_missing_axis_and_the_mesh_that_names_it(tmp_path):
    """The README's ``virtualpar run step.py:step -n 4`` raised ``unknown mesh axis 'tp'`` and
    stopped there; its output also began with two blank lines."""
    (tmp_path / "step.py").write_text(_STEP)
    got = subprocess.run([sys.executable, "-m", "virtualpar", "run", "step.py:step", "-n", "4"], cwd=tmp_path,
                         capture_output=True, text=True, env=ENV, timeout=120)
    assert got.returncode == 1
    last = got.stderr.rstrip().splitlines()[-1]
    assert last.startswith("virtualpar run: UnknownAxisError: device ") and "unknown mesh axis 'tp'" in last
    assert "-n 4 makes a one-axis mesh (world=4): name the axes with --mesh, e.g. --mesh tp=4" in last
    assert "--mesh dp=2,tp=2" in last
    assert not got.stderr.startswith("\n") and got.stderr.startswith("Traceback")  # the device's, first
    fixed = subprocess.run([sys.executable, "-m", "virtualpar", "run", "step.py:step", "--mesh", "dp=2,tp=2"],
                           cwd=tmp_path, capture_output=True, text=True, env=ENV, timeout=120)
    assert fixed.returncode == 0, fixed.stderr
    assert [line.split(":")[1].split()[0] for line in fixed.stdout.splitlines()] == ["3.0"] * 4  # 1 + 2
