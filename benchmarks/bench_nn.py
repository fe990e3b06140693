"""What the differentiation mechanism costs: ``nn.value_and_grad`` against a hand-written backward.

Forward + backward of the MLP 256→512→1024→512→256 (ReLU, MSE), batch 64, float32: through
``nn.value_and_grad`` (autograd) and written out by hand in numpy, measured alternately in the
same run; the target is ≤ 1.3× the hand-written time.  Also the GRU's forward + backward per
time step (2 layers, hidden 256, batch 64, 16 steps).

    python benchmarks/bench_nn.py [--repeats 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from virtualpar import nn
from virtualpar.commands._args import positive_int
from virtualpar.commands._progress import bar
from virtualpar.commands.pipeline_demo import seed_mlp

SIZES = (256, 512, 1024, 512, 256)
TARGET = 1.3


def mlp(dtype=np.float32) -> nn.Sequential:
    return seed_mlp(dtype, SIZES)


def hand_written(params: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray,
                 y: np.ndarray) -> tuple[float, list]:
    """Forward and backward of the same MLP, by hand: what autograd competes with."""
    acts, pre = [x], []
    h = x
    for i, (w, b) in enumerate(params):
        z = h @ w + b
        pre.append(z)
        h = z * (z > 0) if i < len(params) - 1 else z
        acts.append(h)
    diff = h - y
    loss = float(np.mean(diff * diff))
    g = (2.0 / diff.size) * diff
    grads = []
    for i in range(len(params) - 1, -1, -1):
        w, _ = params[i]
        grads.append((acts[i].T @ g, g.sum(0)))
        if i:
            g = (g @ w.T) * (pre[i - 1] > 0)
    return loss, grads[::-1]


def _time(fn, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def bench_mlp(repeats: int, iters: int) -> dict:
    model = mlp()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, SIZES[0])).astype(np.float32)
    y = rng.standard_normal((64, SIZES[-1])).astype(np.float32)
    params = [(model[i].weight, model[i].bias) for i in range(0, len(model), 2)]
    auto = lambda: nn.value_and_grad(lambda m, a, b: nn.mse_loss(m(a), b), model, x, y)
    hand = lambda: hand_written(params, x, y)
    loss_a, grads = auto()
    loss_h, grads_h = hand()
    assert abs(loss_a - loss_h) <= 1e-5 * abs(loss_h)
    np.testing.assert_allclose(grads["0.weight"], grads_h[0][0], rtol=2e-4, atol=1e-6)
    ours, theirs = [], []
    for _ in range(repeats):  # alternate, so a burst of load hits both
        ours.append(_time(auto, iters))
        theirs.append(_time(hand, iters))
    ratios = [a / b for a, b in zip(ours, theirs)]
    return {"autograd_s": statistics.median(ours), "hand_s": statistics.median(theirs),
            "ratio": statistics.median(ratios), "target": TARGET}


def bench_gru(iters: int) -> dict:
    steps, batch, hidden = 16, 64, 256
    model = nn.GRU(hidden, hidden, num_layers=2, dtype=np.float32)
    x = np.random.default_rng(1).standard_normal((batch, steps, hidden)).astype(np.float32)
    fwd = lambda: model(x)
    both = lambda: nn.value_and_grad(lambda m, a: m(a)[0].sum(), model, x)
    both()
    f, fb = _time(fwd, iters), _time(both, iters)
    return {"steps": steps, "batch": batch, "hidden": hidden, "layers": 2,
            "forward_per_step_s": f / steps, "forward_backward_per_step_s": fb / steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=positive_int, default=7,
                    help="alternating repeats of autograd and the hand-written backward; medians (default 7)")
    ap.add_argument("--iters", type=positive_int, default=20,
                    help="calls timed per repeat (default 20; the GRU takes a fifth of them)")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = ap.parse_args()
    with bar(2, "bench_nn", "section") as step:
        result = {"mlp": bench_mlp(args.repeats, args.iters)}
        step()
        result["gru"] = bench_gru(max(2, args.iters // 5))
        step()
    if args.json:
        print(json.dumps(result))
        return
    m, g = result["mlp"], result["gru"]
    print("# nn: autograd vs hand-written numpy, same run (MLP 256-512-1024-512-256, batch 64, float32)")
    print(f"forward+backward  autograd {m['autograd_s'] * 1e3:8.3f} ms   hand-written "
          f"{m['hand_s'] * 1e3:8.3f} ms   "
          f"ratio {m['ratio']:.2f}x  (target <= {TARGET}x: {'PASS' if m['ratio'] <= TARGET else 'FAIL'})")
    print(f"GRU 2x{g['hidden']}, batch {g['batch']}: forward {g['forward_per_step_s'] * 1e3:.3f} ms/step, "
          f"forward+backward {g['forward_backward_per_step_s'] * 1e3:.3f} ms/step")


if __name__ == "__main__":
    main()
