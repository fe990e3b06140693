"""``benchmarks/bench_pipeline.py``'s floor runs a whole training step's compute: its gradient sums
equal the mean loss's gradients taken over the whole batch in one process, and it counts every
activation and its gradient once each.  (No timing is asserted: the target lives in the bench.)"""

from __future__ import annotations

import importlib.util
import os

import numpy as np

from virtualpar import nn
from virtualpar.pipeline import Pipeline

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                     "bench_pipeline.py")
_spec = importlib.util.spec_from_file_location("bench_pipeline", _PATH)
bench_pipeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_pipeline)


def test_the_floor_is_one_step_of_the_mean_loss():
    rng = np.random.default_rng(3)
    model = nn.Sequential(nn.Linear(6, 8, seed=0, dtype=np.float64), nn.ReLU(),
                          nn.Linear(8, 5, seed=1, dtype=np.float64), nn.ReLU(),
                          nn.Linear(5, 4, seed=2, dtype=np.float64))
    x, y = rng.standard_normal((12, 6)), rng.standard_normal((12, 4))
    pipe = Pipeline(model, cuts=[2, 4])
    M = 4
    compute, sent, sums = bench_pipeline._compute_floor(pipe, x, y, M)
    _, want = nn.value_and_grad(lambda m, a, b: nn.mse_loss(m(a), b), model, x, y)
    got = {f"{int(k.split('.')[0]) + stage.first_layer}.{k.split('.', 1)[1]}": v
           for stage in pipe.stages for k, v in sums[stage.index].items()}
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-15)
    assert sent == M * 2 * (3 * 8 + 3 * 5) * 8  # per microbatch: 3 rows of 8 and of 5 float64, there and back
    assert compute > 0
