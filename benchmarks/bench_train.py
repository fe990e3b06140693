"""A training step of GPT ``small`` on 8 devices against its floor, and beside it the peers.

The configuration is the one ``virtualpar train`` runs by default, at ``small``'s size: dp=2, pp=2,
tp=2, 4 microbatches, 1F1B, ZeRO-1, float32, a batch of 8 × 128 tokens, AdamW.

**The floor** (measured in the same run, paired round by round as ``_report.py`` explains): every
device's kernels run in one process — the step's forward and backward over the same rows in the
same microbatches (dp × M of them, each b rows as a device sees them), the gradients summed, and
the AdamW update of every parameter: the same FLOPs as the 8 devices' sharded kernels together
(tensor parallelism splits each matmul, it does not add to it) — plus every byte the devices moved
in the step (``cluster.stats()``, device to device and host to device) at the memcpy bandwidth
measured in the same round.  The ratio is the cluster's wall time per step over that floor; target
<= 1.5x, on the median of the rounds.

**Peers**, when installed (never installed by this script): JAX on 8 virtual CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``; the same GPT, jit with ``NamedSharding``
over a (dp, tp) mesh; JAX has no pipeline axis, so pp's devices become dp: ``_jax_train.py``) and
torch's pipelining (``Schedule1F1B``) with DTensor tensor parallelism over gloo, dp=2 × pp=2 × tp=2
as here (``_torch_train.py``); each ratio is printed whichever way it falls, or "skipped" with the
reason.  ``--peer-python`` names the interpreter that has them (a separate venv).

    python benchmarks/bench_train.py [--rounds 3] [--quick] [--json] [--peer-python /path/to/venv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from virtualpar import VirtualCluster, nn
from virtualpar.commands.train import synthetic_batch
from virtualpar.parallel import ParallelConfig, ParallelTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this directory, also when imported
from _references import memcpy_Bps  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = dict(dp=2, pp=2, tp=2, microbatches=4, schedule="1f1b", zero=1)


def one_process_step(model: nn.GPT, optimizer: nn.Optimizer, tokens: np.ndarray, targets: np.ndarray,
                     parts: int) -> float:
    """Seconds of the step's kernels in this process: forward + backward of ``parts`` microbatches,
    the gradients summed, one optimizer step on every parameter."""
    params = model.parameters()
    t0 = time.perf_counter()
    total: dict[str, np.ndarray] = {}
    for x, y in zip(np.array_split(tokens, parts), np.array_split(targets, parts)):
        rec = nn.vjp(lambda p, inp, y=y: nn.cross_entropy(nn.functional_call(model, p, inp), y), x,
                     params=params, input_grads=False)
        _, grads = rec.backward(1.0 / parts)
        for k, g in grads.items():
            if k in total:
                np.add(total[k], g, out=total[k])
            else:
                total[k] = np.array(g, copy=True)
    optimizer.step(params, total)
    return time.perf_counter() - t0


def floor_and_wall(model_name: str, rounds: int, steps: int) -> dict:
    cfg = ParallelConfig(**CONFIG)
    model = nn.GPT.preset(model_name)
    batch, seq = 8, model.seq_len
    tokens, targets = synthetic_batch(0, batch, seq, model.vocab)
    trainer = ParallelTrainer(model, cfg, optimizer=nn.AdamW(1e-3))
    reference, opt = nn.GPT.preset(model_name), nn.AdamW(1e-3)
    per_round = []
    with VirtualCluster(cfg.mesh(), hardware="h100-node") as cluster:
        cluster.execute(trainer, tokens, targets)  # places the weights; not timed
        for _ in range(rounds):
            parts = cfg.dp * cfg.microbatches
            floor_s = statistics.median(one_process_step(reference, opt, tokens, targets, parts)
                                        for _ in range(steps))
            memcpy = memcpy_Bps()
            time.sleep(0.3)  # the floor's BLAS threads spin a while before they sleep
            walls, moved = [], []
            for _ in range(steps):
                before = cluster.stats()
                t0 = time.perf_counter()
                cluster.execute(trainer, tokens, targets)
                walls.append(time.perf_counter() - t0)
                after = cluster.stats()
                moved.append(int(after.bytes.sum() - before.bytes.sum())
                             + int(after.host_to_device.sum() - before.host_to_device.sum()))
            sent = statistics.median(moved)
            floor = floor_s + sent / memcpy
            wall = statistics.median(walls)
            per_round.append({"kernels_s": floor_s, "bytes_moved": sent, "memcpy_GBps": memcpy / 1e9,
                              "floor_s": floor, "wall_s": wall, "ratio": wall / floor})
        modelled = trainer.last_step_time
    mid = sorted(per_round, key=lambda r: r["ratio"])[len(per_round) // 2]
    return {"model": model_name, "config": CONFIG, "batch": batch, "seq": seq, "rounds": per_round, **mid,
            "modelled_step_s": modelled, "target": 1.5}


def peer(name: str, script: str, env: dict[str, str], module: str, wall: float, python: str) -> dict:
    """Run a peer's script with ``python`` (its own environment) if ``module`` is installed there."""
    path = os.path.join(HERE, script)
    has = subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0
    if not has:
        return {"peer": name, "skipped": f"{module} is not installed for {python}"}
    if not os.path.exists(path):
        return {"peer": name, "skipped": f"no peer script {script} yet"}
    done = subprocess.run([python, path], capture_output=True, text=True, timeout=1800,
                          env={**os.environ, **env})
    if done.returncode != 0:
        return {"peer": name, "skipped": f"failed: {done.stderr.strip().splitlines()[-1:]}"}
    seconds = float(json.loads(done.stdout.strip().splitlines()[-1])["step_s"])
    return {"peer": name, "step_s": seconds, "ratio": wall / seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="paired rounds (default 3)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per round and side (default 2)")
    ap.add_argument("--quick", action="store_true", help="smoke run: the tiny model, 1 round, no peers")
    ap.add_argument("--peer-python", default=sys.executable, metavar="PYTHON",
                    help="the interpreter that runs the peers (a venv with jax or torch; default this one)")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON object")
    args = ap.parse_args()
    model = "tiny" if args.quick else "small"
    result = floor_and_wall(model, 1 if args.quick else args.rounds, 1 if args.quick else args.steps)
    peers = [] if args.quick else [
        peer("JAX, 8 virtual CPU devices, jit + NamedSharding", "_jax_train.py",
             {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}, "jax", result["wall_s"],
             args.peer_python),
        peer("torch pipelining + DTensor over gloo", "_torch_train.py", {}, "torch", result["wall_s"],
             args.peer_python)]
    result["peers"] = peers
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"# bench_train: GPT {model!r}, {CONFIG}, batch {result['batch']} x {result['seq']}, float32, "
          f"AdamW")
    print(f"{'round':>5} {'kernels s':>10} {'MiB moved':>10} {'memcpy GB/s':>12} {'floor s':>8} "
          f"{'wall s':>8} "
          f"{'ratio':>6}")
    for i, r in enumerate(result["rounds"]):
        print(f"{i:>5} {r['kernels_s']:>10.3f} {r['bytes_moved'] / 2**20:>10.1f} {r['memcpy_GBps']:>12.1f} "
              f"{r['floor_s']:>8.3f} {r['wall_s']:>8.3f} {r['ratio']:>6.2f}")
    verdict = "PASS" if result["ratio"] <= result["target"] else "FAIL"
    print(f"step: {result['wall_s']:.3f} s wall against a floor of {result['floor_s']:.3f} s: ratio "
          f"{result['ratio']:.2f}x (median round; target <= {result['target']}x) {verdict}; modelled on "
          f"h100-node "
          f"{result['modelled_step_s'] * 1e6:.1f} us")
    for p in peers:
        if "skipped" in p:
            print(f"peer {p['peer']}: skipped ({p['skipped']})")
        else:
            print(f"peer {p['peer']}: {p['step_s']:.3f} s a step; virtualpar / peer = {p['ratio']:.2f}x")


if __name__ == "__main__":
    main()
