"""Chaos: a pipeline trained through seeded random faults ends with the fault-free run's weights, bit for bit.

Training runs for ``--steps`` steps (a 4-stage MLP in float64, Adam, 1F1B on 4 devices).  Before
a step, with probability ``--rate``, one fault is injected: a device (chosen at random) raises,
is killed, exits, hangs, or the driver is interrupted (Ctrl-C) while the device dawdles — at a
random one of the step's sends and receives on that device.  After a fault, training goes on by
itself: on the same cluster when it survived (a raise), else on a new cluster, where the
operation resumes from its last committed step (``virtualpar.checkpoint``).  Each step's batch is
a function of the step number (``op.step``), and every reduction has a fixed order, so the final
weights must equal the fault-free run's exactly.

It prints the faults injected and survived, the step attempts lost and the committed steps rolled
back (0: the driver copy keeps every committed step), the clusters started, whether the weights
equal the fault-free run bit for bit, and what was left behind: processes, /dev/shm entries no
live process holds, and ``pymp-*`` directories (the run's temporary directory is a private one,
so any there is this run's).

``--model gpt`` trains the composed trainer instead (``ParallelTrainer``: a 2-layer float64 GPT,
AdamW, dp=2 × pp=2 with ZeRO-1 on 4 devices); its faults land at any send, receive or collective
of a step (their number per device is counted on a step run beforehand).

``--copy-cost`` measures instead what the driver copy adds to a step of the composed trainer (a
float32 ``GPT.preset("tiny")``, dp=2 × tp=2, ZeRO-1, batch 8 × 32): as section 5 of
``bench_pipeline.py`` does for the pipeline, each reporting device's slot-file write (median of 9),
summed over the devices as if none overlapped, against the median step with the copy on; beside
it the paired difference of whole steps with the copy on and off.  Target < 5%.

    python benchmarks/bench_chaos.py [--steps 200] [--seed 0] [--rate 0.1] [--model mlp|gpt] [--json]
    python benchmarks/bench_chaos.py --copy-cost [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

from virtualpar import VirtualCluster, VirtualParError, nn
from virtualpar.parallel import ParallelConfig, ParallelTrainer
from virtualpar.pipeline import TRANSFER, Pipeline, PipelinedOperation, build, lower
from virtualpar.testing.leaks import children

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this directory, also when imported
from _references import time_slot_writes  # noqa: E402

KINDS = ("raise", "kill", "exit", "hang", "interrupt")
WIDTH, ROWS = 16, 16


def make_op(stages: int, microbatches: int) -> PipelinedOperation:
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH, seed=i, dtype=np.float64) for i in range(stages)])
    return PipelinedOperation(Pipeline(model, cuts=list(range(1, stages))), "1f1b", microbatches=microbatches,
                              optimizer=nn.Adam(1e-2))


def batch(seed: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, step])
    return rng.standard_normal((ROWS, WIDTH)), rng.standard_normal((ROWS, WIDTH))


GPT_CONFIG = ParallelConfig(dp=2, pp=2, microbatches=2, zero=1)
GPT_ROWS, GPT_SEQ, GPT_VOCAB = 8, 8, 32


def make_trainer() -> ParallelTrainer:
    return ParallelTrainer(nn.GPT(GPT_VOCAB, 16, 2, 2, GPT_SEQ, seed=0, dtype=np.float64), GPT_CONFIG,
                           optimizer=nn.AdamW(1e-2))


def gpt_batch(seed: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, step])
    return rng.integers(0, GPT_VOCAB, (GPT_ROWS, GPT_SEQ)), rng.integers(0, GPT_VOCAB, (GPT_ROWS, GPT_SEQ))


def _op_seq(dev: Any) -> int:
    return dev.op_seq


def counted_ops(make: Callable[[], Any], mesh: Any, data: Callable[[int], tuple]) -> list[int]:
    """Each device's sends, receives and collectives in one step (counted, as ``inject`` counts them)."""
    op = make()
    with VirtualCluster(mesh) as cluster:
        cluster.execute(op, *data(0))  # the first step places the weights (set-up runs count no ops)
        before = cluster.run(_op_seq)
        cluster.execute(op, *data(1))
        return [b - a for a, b in zip(before, cluster.run(_op_seq))]


def ops_per_rank(ranks: int, microbatches: int) -> list[int]:
    """Each rank's sends and receives in one 1F1B step: where a fault can be injected (``at_op``)."""
    lowered = lower(*build("1f1b", ranks, microbatches))
    return [sum(a is not None and a.kind in TRANSFER for a in lowered[r]) for r in range(ranks)]


def plan_faults(seed: int, steps: int, rate: float, ops: list[int], kinds: tuple[str, ...] = KINDS) -> dict:
    """{step: (kind, rank, at_op)}: at most one fault per step, injected at its first attempt."""
    rng = random.Random(seed)
    plan = {}
    for step in range(steps):
        if rng.random() < rate:
            rank = rng.randrange(len(ops))
            plan[step] = (rng.choice(kinds), rank, rng.randint(1, ops[rank]))
    return plan


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt  # what Ctrl-C raises in the driver


def train_through_faults(op: PipelinedOperation, steps: int, plan: dict,
                         new_cluster: Callable[[], VirtualCluster], data: Callable[[int], tuple]) -> dict:
    """Train ``op`` until it has committed ``steps`` steps, injecting ``plan``'s faults and starting a new
    cluster whenever one closed.  Returns the counts (see the module doc)."""
    stats = {"injected": 0, "fired": 0, "survived": 0, "attempts_lost": 0, "rolled_back": 0, "clusters": 0,
             "by_kind": {}, "unplanned": []}
    pending = dict(plan)
    cluster = None
    old = signal.signal(signal.SIGALRM, _interrupt)
    try:
        while op.step < steps:
            if cluster is None or cluster.closed:
                if cluster is not None:
                    cluster.close()
                cluster = new_cluster()
                stats["clusters"] += 1
            fault = pending.pop(op.step, None)
            if fault is not None:
                kind, rank, at = fault
                cluster.inject(rank, at, "delay" if kind == "interrupt" else kind,
                               **({"seconds": 1.0} if kind == "interrupt" else {}))
                stats["injected"] += 1
                stats["by_kind"][kind] = stats["by_kind"].get(kind, 0) + 1
            before = op.step
            try:
                try:
                    if fault is not None and fault[0] == "interrupt":
                        signal.setitimer(signal.ITIMER_REAL, 0.2)
                    cluster.execute(op, *data(op.step))
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except (VirtualParError, KeyboardInterrupt) as exc:
                stats["attempts_lost"] += 1
                stats["rolled_back"] += before - op.step
                if fault is None:
                    stats["unplanned"].append(f"step {before}: {type(exc).__name__}: {str(exc)[:200]}")
                else:
                    stats["fired"] += 1
                if isinstance(exc, KeyboardInterrupt) and not cluster.closed:
                    cluster.close()  # a Ctrl-C between two runs: the script would stop here
                continue
            if fault is not None:  # a fault that never fired (e.g. its op was not reached)
                stats["unplanned"].append(f"step {before}: the {fault[0]} fault at op "
                                          f"{fault[2]} of rank {fault[1]} "
                                          "did not stop the step")
        stats["survived"] = stats["fired"]  # training reached the end after every one of them
    finally:
        signal.signal(signal.SIGALRM, old)
        if cluster is not None:
            cluster.close()
    return stats


def fault_free(make: Callable[[], Any], mesh: Any, steps: int,
               data: Callable[[int], tuple]) -> dict[str, np.ndarray]:
    op = make()
    with VirtualCluster(mesh) as cluster:
        for _ in range(steps):
            cluster.execute(op, *data(op.step))
        return op.state_dict(cluster)


# the runtime's segments, multiprocessing's semaphores and blocks
_OURS = ("virtualpar-", "sem.mp-", "psm_", "mp-")


def _shm_left(before: set[str]) -> list[str]:
    """New /dev/shm entries of the kinds this run makes that no live process maps (a concurrent
    session's live segments are not ours; an MPICH job's are of another kind)."""
    new = {n for n in set(os.listdir("/dev/shm")) - before if n.startswith(_OURS)}
    mapped = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                text = f.read()
        except OSError:
            continue
        mapped.update(n for n in new if f"/dev/shm/{n}" in text)
    return sorted(new - mapped)


def leftovers(shm_before: set[str], tmp: str, settle: float = 3.0) -> dict:
    """What the run left: our child processes, unheld /dev/shm entries, pymp-* directories in ``tmp``."""
    deadline = time.monotonic() + settle
    while True:
        left = {"processes": sorted(children()), "shm": _shm_left(shm_before),
                "pymp": sorted(n for n in os.listdir(tmp) if n.startswith("pymp-"))}
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def chaos(steps: int = 200, seed: int = 0, rate: float = 0.1, stages: int = 4, microbatches: int = 4,
          timeout: float = 2.0, kinds: tuple[str, ...] = KINDS, plan: dict | None = None,
          model: str = "mlp") -> dict:
    """The whole run (see the module doc); ``plan`` ({step: (kind, rank, at_op)}) replaces the seeded one;
    ``model`` "gpt": the composed trainer (``stages`` and ``microbatches`` are then its configuration's)."""
    if model == "gpt":
        make, mesh, data = make_trainer, GPT_CONFIG.mesh(), lambda step: gpt_batch(seed, step)
        stages, microbatches = GPT_CONFIG.pp, GPT_CONFIG.microbatches
    elif model == "mlp":
        make, mesh, data = (lambda: make_op(stages, microbatches)), stages, (lambda step: batch(seed, step))
    else:
        raise ValueError(f"model must be 'mlp' or 'gpt', got {model!r}")
    tmp = tempfile.mkdtemp(prefix="vp-chaos-")
    saved, tempfile.tempdir = tempfile.tempdir, tmp  # multiprocessing's pymp-* directories land here
    shm_before = set(os.listdir("/dev/shm"))
    try:
        t0 = time.perf_counter()
        want = fault_free(make, mesh, steps, data)
        clean_s = time.perf_counter() - t0
        if plan is None:
            ops = ops_per_rank(stages, microbatches) if model == "mlp" else counted_ops(make, mesh, data)
            plan = plan_faults(seed, steps, rate, ops, kinds)
        op = make()
        t0 = time.perf_counter()
        stats = train_through_faults(op, steps, plan,
                                     lambda: VirtualCluster(mesh, timeout=timeout, abort_grace=0.5,
                                                                             run_timeout=10 * timeout), data)
        chaos_s = time.perf_counter() - t0
        weights = op.committed_state_dict()  # the devices are gone: the driver's copy of the last step
        equal = list(weights) == list(want) and all(weights[k].dtype == want[k].dtype and
                                                    np.array_equal(weights[k], want[k]) for k in want)
        del op
        left = leftovers(shm_before, tmp)
    finally:
        tempfile.tempdir = saved
        shutil.rmtree(tmp, ignore_errors=True)
    return {"model": model, "steps": steps, "seed": seed, "rate": rate, "stages": stages,
            "microbatches": microbatches,
            **stats, "bit_equal": equal, "fault_free_s": clean_s, "chaos_s": chaos_s, "left": left}


def _slot_write_seconds(dev: Any, key: str, reps: int) -> tuple[float, int]:
    """On a device: the median time of writing its raw report of the committed state into a slot file,
    as each committed step does (``parallel/committed.py``), into a file of its own in the same place
    (the first write, which gives the file its pages, untimed, as the step's slots keep theirs)."""
    from virtualpar.parallel.committed import _reported

    st = dev.state[key]
    mine = _reported(dev, st, {s: (st["params"][s], st["optimizers"][s]) for s in st["params"]})
    return time_slot_writes(mine, reps)


def copy_cost(rounds: int = 5, steps: int = 4, reps: int = 9) -> dict:
    """The driver copy's cost per step of the composed trainer (see the module doc)."""
    cfg = ParallelConfig(dp=2, tp=2, zero=1)
    model = nn.GPT.preset("tiny")
    rng = np.random.default_rng(1)
    tokens, targets = rng.integers(0, model.vocab, (8, 32)), rng.integers(0, model.vocab, (8, 32))
    trainer = ParallelTrainer(model, cfg, optimizer=nn.AdamW(1e-3))
    per_round = []
    with VirtualCluster(cfg.mesh()) as cluster:
        cluster.execute(trainer, tokens, targets)
        for _ in range(rounds):
            walls: dict[bool, list[float]] = {True: [], False: []}
            for on in (True, False):
                trainer.configure_recovery(driver_copy=on)
                cluster.execute(trainer, tokens, targets)  # the switch, untimed
                for _ in range(steps):
                    t0 = time.perf_counter()
                    cluster.execute(trainer, tokens, targets)
                    walls[on].append(time.perf_counter() - t0)
            writes = cluster.run(_slot_write_seconds, trainer.key, reps)
            on, off = statistics.median(walls[True]), statistics.median(walls[False])
            copy_s = sum(t for t, _ in writes)
            per_round.append({"copy_s": copy_s, "bytes": sum(n for _, n in writes), "with_s": on,
                              "without_s": off, "ratio": copy_s / on, "paired_ratio": (on - off) / off})
    mid = sorted(per_round, key=lambda r: r["ratio"])[len(per_round) // 2]
    return {"config": "GPT tiny float32, dp=2 tp=2 zero=1, batch 8 x 32, AdamW", "rounds": per_round, **mid,
            "target": 0.05}


def print_copy_cost(d: dict) -> None:
    verdict = "PASS" if d["ratio"] < d["target"] else "FAIL"
    print(f"# driver copy of each committed step, ParallelTrainer ({d['config']}): "
          f"{d['bytes'] / 2**20:.2f} MiB "
          "written into slot files per step")
    print(f"copy {d['copy_s'] * 1e3:.2f} ms summed over the devices, a step {d['with_s'] * 1e3:.2f} ms: "
          f"{d['ratio'] * 100:.2f}% of a step (target < {d['target'] * 100:.0f}%: {verdict}; the median of "
          f"{len(d['rounds'])} rounds: " + " ".join(f"{r['ratio'] * 100:.2f}%" for r in d["rounds"])
          + "; paired whole steps on - off, noise included: "
          + " ".join(f"{r['paired_ratio'] * 100:+.0f}%" for r in d["rounds"]) + ")")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="training steps through the faults (default 200)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the fault plan and of the batches (default 0)")
    ap.add_argument("--rate", type=float, default=0.1,
                    help="probability of a fault before each step (default 0.1)")
    ap.add_argument("--model", choices=("mlp", "gpt"), default="mlp",
                    help="mlp: the 4-stage pipeline MLP; gpt: the composed trainer (dp=2 x pp=2, ZeRO-1)")
    ap.add_argument("--copy-cost", action="store_true",
                    help="measure the driver copy's cost per step of the composed trainer instead")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = ap.parse_args()
    if args.copy_cost:
        d = copy_cost()
        print(json.dumps(d)) if args.json else print_copy_cost(d)
        return 0 if d["ratio"] < d["target"] else 1
    if not args.json:  # the operation's one line per resume, in order with the rest
        logging.basicConfig(stream=sys.stdout, format="  %(message)s", level=logging.WARNING)
    r = chaos(args.steps, args.seed, args.rate, model=args.model)
    if args.json:
        print(json.dumps(r))
        return 0 if r["bit_equal"] and not any(r["left"].values()) else 1
    what = (f"a {r['stages']}-stage MLP (float64, Adam, 1F1B, {r['microbatches']} "
            "microbatches)" if r["model"] == "mlp"
            else f"a GPT by ParallelTrainer (float64, AdamW, dp={GPT_CONFIG.dp} x pp={GPT_CONFIG.pp}, ZeRO-"
                 f"{GPT_CONFIG.zero}, {r['microbatches']} microbatches)")
    print(f"# chaos: {r['steps']} steps of {what}, seed {r['seed']}, a fault before a step with probability "
          f"{r['rate']}")
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(r["by_kind"].items()))
    print(f"faults injected   {r['injected']} ({kinds})")
    print(f"faults survived   {r['survived']} (training went on after each, by itself)")
    print(f"steps redone      {r['attempts_lost']} step attempts lost, {r['rolled_back']} "
          "committed steps rolled back")
    print(f"clusters started  {r['clusters']}")
    for line in r["unplanned"]:
        print(f"unplanned         {line}")
    print(f"final weights     {'EQUAL' if r['bit_equal'] else 'DIFFERENT'} to the "
          "fault-free run, bit for bit")
    left = r["left"]
    print(f"left behind       {len(left['processes'])} processes, {len(left['shm'])} /dev/shm entries, "
          f"{len(left['pymp'])} pymp-* directories" + ("" if not any(left.values()) else f": {left}"))
    print(f"time              {r['chaos_s']:.1f} s with faults, {r['fault_free_s']:.1f} s without")
    return 0 if r["bit_equal"] and not any(left.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
