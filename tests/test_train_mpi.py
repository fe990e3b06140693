"""``virtualpar train`` under mpiexec (every rank drives its own part of the step) ends with the
emulator's weights, within 1e-12 after 3 float64 steps."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ._mpi import run_mpiexec


def _mpiexec() -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else shutil.which("mpiexec")


def _train(tmp_path, name: str, flags: list[str], launcher: list[str] | None = None) -> dict:
    out = tmp_path / f"{name}.npz"
    argv = [sys.executable, "-m", "virtualpar", "train", "--steps", "3", "--dtype", "float64", "--json",
            "--weights", str(out), *flags]
    if launcher is None:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    else:
        done = run_mpiexec(launcher + argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with np.load(out) as f:
        weights = {k: f[k] for k in f}
    import json
    from virtualpar.commands.train import weights_l2
    assert json.loads(done.stdout)["weights_l2"] == weights_l2(weights)
    return weights


def check_same_weights(tmp_path, n: int, flags: list[str]) -> None:
    if _mpiexec() is None:
        pytest.skip("mpiexec is not installed (pip install mpich)")
    real = _train(tmp_path, "mpi", flags, [_mpiexec(), "-n", str(n)])
    emu = _train(tmp_path, "emu", flags)
    assert sorted(real) == sorted(emu) and len(emu) > 10
    for k in emu:
        np.testing.assert_allclose(real[k], emu[k], rtol=0, atol=1e-12, err_msg=k)
    from virtualpar import nn
    start = nn.GPT.preset("tiny", dtype=np.float64).state_dict()
    assert max(np.abs(emu[k] - start[k]).max() for k in emu) > 1e-4  # the steps moved the weights


def test_mpiexec_4_ranks_end_with_the_emulator_s_weights(tmp_path):
    """With dropout too: each rank draws its piece of the masks from the step it counts itself."""
    check_same_weights(tmp_path, 4, ["--mesh", "pp=2,tp=2", "--microbatches", "2", "--zero", "0",
                                     "--sequence-parallel", "--dropout", "0.1"])


@pytest.mark.slow
def test_mpiexec_8_ranks_dp_pp_tp_end_with_the_emulator_s_weights(tmp_path):
    check_same_weights(tmp_path, 8, ["--mesh", "dp=2,pp=2,tp=2", "--microbatches", "4", "--zero", "1"])


def test_mpiexec_with_the_wrong_number_of_ranks_is_a_usage_error(tmp_path):
    if _mpiexec() is None:
        pytest.skip("mpiexec is not installed (pip install mpich)")
    done = run_mpiexec([_mpiexec(), "-n", "2", sys.executable, "-m", "virtualpar", "train", "--mesh", "tp=4",
                        "--steps", "1"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2
    assert "mpiexec -n 4" in done.stderr


def test_mpiexec_refuses_save_and_resume_saying_why(tmp_path):
    if _mpiexec() is None:
        pytest.skip("mpiexec is not installed (pip install mpich)")
    done = run_mpiexec([_mpiexec(), "-n", "2", sys.executable, "-m", "virtualpar", "train", "--mesh", "dp=2",
                        "--steps", "1", "--save", str(tmp_path / "ck")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2
    assert "not supported under mpiexec" in done.stderr and "--weights" in done.stderr
