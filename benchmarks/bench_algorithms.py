"""Sweep: every algorithm of a collective against the default choice, by size and group size.

For each device count n and message size, the steady time (median of a few calls, the slowest
device's) of every algorithm (all_reduce: ``ring``, ``tree``, ``direct``, ``shm``; all_gather:
``ring``, ``direct``, ``shm``; broadcast from device 0: ``tree``, ``shm``; reduce_scatter:
``ring``, ``shm``; all_to_all: ``direct``, ``shm``) and of the default choice (``algorithm=None``).  An
all_gather's size is the gathered array's, as nccl-tests counts it (each device contributes size / n), a
reduce_scatter's the array each device reduces (each gets size / n back), an all_to_all's the array each
device splits.  The default must never be more than 10% slower than the best algorithm
for that (size, n); the thresholds in ``virtualpar/collectives/selection.py`` come from this sweep
(see benchmarks/README.md).

Paired, because this shared machine's speed drifts by ±30% over a minute (``_report.py``): every
round times each algorithm and the default back to back, in an order that rotates from round to
round.  The verdict judges the default's *choice*: ``chosen/best`` is the median over the rounds
of the time of the algorithm the default picks (``default_algorithm``) over the best algorithm's
*in the same round* — 1.00 wherever the default picks the best.  The default column itself is the
same algorithm called without naming it; ``def/chosen`` (median over rounds of the default's time
over its algorithm's) shows that path adds nothing beyond the noise of timing one thing twice —
which on this VM reaches ±25% for a cell (it was the verdict until 2026-11-23, and then failed
cells where the default *was* the best).  The table's per-algorithm times are medians over rounds.  An
algorithm that refuses a size is shown as ``refused`` and left out of that cell's best: ``direct`` all_reduce
refuses what would take more than 80% of the machine's memory (128 devices and 512 KiB here).

    python benchmarks/bench_algorithms.py --devices 2,4,8,16,32,64 --sizes 1024,8192,65536,524288,4194304
    python benchmarks/bench_algorithms.py --collective all_gather
    python benchmarks/bench_algorithms.py --collective broadcast
    python benchmarks/bench_algorithms.py --collective reduce_scatter
    python benchmarks/bench_algorithms.py --collective all_to_all
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from virtualpar import VirtualCluster
from virtualpar.collectives import ALGORITHMS, default_algorithm
from virtualpar.commands._args import positive_int, positive_ints
from virtualpar.commands._progress import bar
from virtualpar.errors import UsageError

COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all")


def _timed(dev, collective: str, count: int, algorithm: str | None, iters: int) -> list[float]:
    x = np.ones(count if collective != "all_gather" else max(1, count // dev.size))
    if collective == "broadcast":
        x = x if dev.rank == 0 else None
        call = dev.broadcast
    else:
        call = {"all_reduce": dev.all_reduce, "all_gather": dev.all_gather,
                "reduce_scatter": dev.reduce_scatter, "all_to_all": dev.all_to_all}[collective]
    out = []
    for _ in range(iters):
        dev.barrier()
        t0 = time.perf_counter()
        call(x, algorithm=algorithm)
        out.append(time.perf_counter() - t0)
    return out


def sweep(devices: list[int], sizes: list[int], iters: int, rounds: int = 5,
          collective: str = "all_reduce") -> list[dict]:
    rows = []
    algos = tuple(ALGORITHMS[collective])
    contenders = (*algos, None)
    with bar(len(devices) * len(sizes), f"bench_algorithms {collective}", "size") as step:
        for n in devices:
            _sweep_cluster(n, sizes, iters, rounds, collective, algos, contenders, rows, step)
    return rows


def _sweep_cluster(n: int, sizes: list[int], iters: int, rounds: int, collective: str, algos: tuple,
                   contenders: tuple, rows: list[dict], step) -> None:
    """Every size on one cluster of ``n`` devices; ``step()`` after each (the progress bar)."""
    with VirtualCluster(n, timeout=120) as cluster:
        for nbytes in sizes:
            runs = []  # the contenders that take this size: 'direct' refuses what the machine cannot hold
            for algo in contenders:
                try:
                    # warm: first-call costs are bench_scale's business
                    cluster.run(_timed, collective, nbytes // 8, algo, 1)
                    runs.append(algo)
                except UsageError:
                    pass
            per_round: list[dict[str, float]] = []
            for k in range(rounds):
                times = {}
                for i in range(len(runs)):  # a rotated order each round
                    algo = runs[(i + k) % len(runs)]
                    per_device = cluster.run(_timed, collective, nbytes // 8, algo, iters)
                    times[algo or "default"] = statistics.median(max(col) for col in zip(*per_device))
                per_round.append(times)
            ran = [a for a in algos if a in runs]
            row = {"collective": collective, "devices": n, "bytes": nbytes, "algorithms": ran,
                   "s": {a: statistics.median(t[a] for t in per_round) for a in per_round[0]}}
            row["best"] = min(ran, key=lambda a: row["s"][a])
            piece = nbytes // n if collective == "all_gather" else nbytes
            chosen = row["chosen"] = default_algorithm(collective, piece, n, shared_memory=True)
            row["chosen_vs_best"] = statistics.median(t[chosen] / min(t[a] for a in ran) for t in per_round)
            row["default_vs_chosen"] = statistics.median(t["default"] / t[chosen] for t in per_round)
            rows.append(row)
            step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=positive_ints, default="2,4,8,16,32,64",
                    help="cluster sizes to sweep, comma-separated (default 2,4,8,16,32,64)")
    ap.add_argument("--sizes", type=positive_ints, default="1024,8192,65536,524288,4194304",
                    help="message sizes in bytes (float64 arrays of size/8), comma-separated "
                         "(default 1024,...,4194304: 1 KiB to 4 MiB)")
    ap.add_argument("--iters", type=positive_int, default=5,
                    help="timed calls per algorithm per round (default 5)")
    ap.add_argument("--rounds", type=positive_int, default=5,
                    help="rounds, each timing every algorithm once in turn; medians over rounds (default 5)")
    ap.add_argument("--collective", choices=COLLECTIVES, default="all_reduce",
                    help="the collective to sweep (default all_reduce): %(choices)s")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    args = ap.parse_args()
    rows = sweep(args.devices, args.sizes, args.iters, args.rounds, args.collective)
    algos = tuple(ALGORITHMS[args.collective])
    if args.json:
        print(json.dumps(rows))
        return
    print(f"# {args.collective} steady time per algorithm, ms (median over rounds of the "
          "slowest device's median);"
          " chosen/best: median over rounds of the default's algorithm / the best, in the same round;"
          " def/chosen: the default (algorithm=None) / its algorithm named")
    print(f"{'n':>4} {'bytes':>9} " + " ".join(f"{a:>9}" for a in (*algos, "default"))
          + f" {'best':>7} {'chosen':>7} {'chosen/best':>12} {'def/chosen':>11}")
    for r in rows:
        cells = " ".join(
            f"{r['s'][a] * 1e3:9.3f}" if a in r["s"] else f"{'refused':>9}" for a in (*algos, "default")
        )
        flag = "" if r["chosen_vs_best"] <= 1.10 else "  <-- over 10%"
        print(f"{r['devices']:>4} {r['bytes']:>9} {cells} {r['best']:>7} {r['chosen']:>7} "
              f"{r['chosen_vs_best']:12.2f}"
              f" {r['default_vs_chosen']:11.2f}{flag}")
    worst = max(rows, key=lambda r: r["chosen_vs_best"])
    verdict = "PASS" if worst["chosen_vs_best"] <= 1.10 else "FAIL"
    spread = [r["default_vs_chosen"] for r in rows]
    print(f"\n{verdict}  the default's algorithm within 10% of the best at every (n, size): worst "
          f"{worst['chosen_vs_best']:.2f}x "
          f"at n={worst['devices']}, {worst['bytes']} bytes (best there: {worst['best']}, "
          f"chosen: {worst['chosen']})")
    print(f"      the default path against naming its algorithm: median {statistics.median(spread):.2f}x "
          f"(cells {min(spread):.2f}-{max(spread):.2f}x: the noise of timing the same code twice)")


if __name__ == "__main__":
    main()
