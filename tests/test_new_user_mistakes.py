"""What a new user gets wrong in the first hour, each answered with what was wrong and how to fix
it, in the driver where the mistake is (not by every device at once, blamed on virtualpar)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from virtualpar import Mesh, UsageError, VirtualCluster, nn
from virtualpar.errors import PayloadError, ShardingError
from virtualpar.pipeline import Pipeline, PipelinedOperation
from virtualpar.tensor_parallel import MatMul, MatMulShardingPolicy
from virtualpar.tensor_parallel.runner import run_forward


def _no_dev(x):
    return x


def test_run_checks_the_function_in_the_driver():
    with VirtualCluster(2) as c:
        with pytest.raises(UsageError,
                           match=r"_no_dev\(\) cannot be called as _no_dev\(dev, \*args, \*\*kwargs\) with "
                                             r"1 argument and no keywords given .*def "
                                             r"_no_dev\(dev, \.\.\.\)"):
            c.run(_no_dev, 1)  # was "raised TypeError in virtualpar code" on every device
        with pytest.raises(UsageError, match=r"with 0 arguments and keywords \['a', 'b'\] given"):
            c.run(_no_dev, b=1, a=2)
        with pytest.raises(UsageError, match="cluster.run needs a function fn"):
            c.run("step")
        with pytest.raises(PayloadError, match="uses the cluster c itself, which stays in the driver"):
            c.run(lambda dev: c.put(0, "k", np.ones(2)))
        assert c.run(lambda dev, k=1: dev.rank + k) == [1, 2]


def test_device_prints_reach_a_file_or_a_pipe(tmp_path):
    """os._exit skipped the flush: printed lines vanished unless stdout was a terminal."""
    script = tmp_path / "pr.py"
    script.write_text("def step(dev):\n    print('hello from', dev.rank)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run([sys.executable, "-m", "virtualpar", "run", f"{script}:step", "-n", "3"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0
    assert sorted(line for line in done.stdout.splitlines() if "hello" in line) == [
        "[0] hello from 0",
        "[1] hello from 1",
        "[2] hello from 2",
    ]  # tagged by rank, as mpiexec --tag-output


def test_run_without_a_function_reads_the_script_without_running_it(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("print('RAN')\ndef step(dev):\n    pass\n")
    done = subprocess.run(
        [sys.executable, "-m", "virtualpar", "run", str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "RAN" not in done.stdout  # an mpi4py script ran real MPI in the driver
    assert f"defines step: e.g. virtualpar run {script}:step" in done.stderr
    (tmp_path / "notes.txt").write_text("def step(dev):\n    pass\n")
    for target in (f"{tmp_path}:step", f"{tmp_path / 'notes.txt'}:step"):
        done = subprocess.run(
            [sys.executable, "-m", "virtualpar", "run", target], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and "is not a Python file" in done.stderr  # an AttributeError traceback
    both = subprocess.run(
        [sys.executable, "-m", "virtualpar", "run", f"{script}:step", "--mesh", "dp=2,tp=2", "-n", "8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert both.returncode == 2 and "-n 8 and --mesh (dp=2, tp=2) (4 devices) disagree" in both.stderr


def test_nn_mistakes_are_named():
    model = nn.Sequential(nn.Linear(4, 2, dtype=np.float64))
    x, y = np.ones((2, 4)), np.zeros((2, 2))
    with pytest.raises(UsageError, match=r"pass \[\(x, y\)\] for one batch, not \(x, y\)"):
        nn.reference_train(
            model, (x, y), nn.mse_loss, nn.SGD(0.1), 1
        )  # 2 rows: trained on the rows as batches
    with pytest.raises(UsageError, match="model must be an nn.Module, got function"):
        nn.value_and_grad(lambda m, a, b: 0.0, lambda a: a, x, y)
    with pytest.raises(UsageError, match=r"gradients for \['1.weight'\], which are not parameters"):
        nn.SGD(0.1).step({"0.weight": np.ones(2)}, {"0.weight": np.ones(2), "1.weight": np.ones(2)})


def test_pipeline_batch_mistakes_are_caught_in_the_driver():
    model = nn.Sequential(nn.Linear(4, 4, dtype=np.float64), nn.Linear(4, 4, seed=1, dtype=np.float64))
    op = PipelinedOperation(Pipeline(model, [1]), "1f1b", microbatches=3)
    with VirtualCluster(2) as c:
        with pytest.raises(UsageError, match=r"^a batch of 10 rows does not split into 3 equal microbatches"):
            c.execute(op, np.ones((10, 4)), np.ones((10, 4)))  # said by 'device 3' with its traceback
        with pytest.raises(UsageError, match="x has 6 rows and y 3"):
            c.execute(op, np.ones((6, 4)), np.ones((3, 4)))


def test_stats_ranks_and_tp_shapes_are_checked():
    mesh = Mesh({"x": 2})
    with VirtualCluster(mesh) as c:
        stats = c.stats()
        for bad in (9, -1):
            with pytest.raises(UsageError, match=r"rank must be a device rank 0..1"):
                stats.sent(bad)  # -1 was silently the last device
        layer = MatMul(MatMulShardingPolicy.named("column", mesh))
        with pytest.raises(
            ShardingError, match=r"MatMul of A \(8, 16\) @ B \(12, 16\) .*inner dimensions 16 and 12"
        ):
            run_forward(c, layer, [np.ones((8, 16)), np.ones((12, 16))], (8, 16))
        with pytest.raises(
            UsageError, match=r"device \d \(x=\d\): compute: flops must be a finite number >= 0"
        ):
            c.run(lambda dev: dev.compute(flops=-5))
    with pytest.raises(ShardingError, match="needs a Mesh .* got int 4"):
        MatMulShardingPolicy.named("row", 4)
