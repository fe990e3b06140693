"""OSU-style benchmarks of virtualpar's transport and collectives, as ratios of references.

Absolute times on a shared 2-core machine mean little, so every bandwidth is printed next to its
ratio against numpy memcpy measured in the same run (and against mpi4py when it is installed and
``mpiexec`` is on PATH).  Bus bandwidth follows NCCL's definitions (nccl-tests, PERFORMANCE.md):
busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather and reduce_scatter.
The modelled column is the op's time on ``--hardware`` (from the last device entering to the last
leaving, on the devices' modelled clocks).

    python benchmarks/bench_collectives.py            # full table
    python benchmarks/bench_collectives.py --quick    # a few sizes, for smoke tests
    python benchmarks/bench_collectives.py --json     # machine-readable
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import shutil
import subprocess
import sys
import time

import numpy as np

from virtualpar import VirtualCluster, __version__

KIB, MIB = 1 << 10, 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))


def _iters(nbytes: int, quick: bool) -> int:
    return 2 if quick else max(3, min(200, (256 * MIB) // max(nbytes, 1)))


# -- references -------------------------------------------------------------------------------------
def bench_memcpy(nbytes: int = 64 * MIB, reps: int = 5) -> float:
    """numpy copyto into a warm destination, bytes/s (the ceiling for moving an array)."""
    a = np.ones(nbytes, np.uint8)
    b = np.empty_like(a)
    np.copyto(b, a)
    t = time.perf_counter()
    for _ in range(reps):
        np.copyto(b, a)
    return nbytes * reps / (time.perf_counter() - t)


def _bare_child(conn) -> None:
    conn.send(b"x")


def bench_bare_fork(n: int = 8) -> float:
    """Seconds to fork n processes that each send one message back (the start-up reference)."""
    ctx = mp.get_context("fork")
    t = time.perf_counter()
    pipes = [ctx.Pipe() for _ in range(n)]
    procs = [ctx.Process(target=_bare_child, args=(child,)) for _, child in pipes]
    for p in procs:
        p.start()
    for parent, _ in pipes:
        parent.recv()
    elapsed = time.perf_counter() - t
    for p in procs:
        p.join()
    return elapsed


def bench_mpi(n: int, quick: bool) -> dict | None:
    """mpi4py's figures from ``_mpi_bench.py`` under mpiexec, or None when unavailable."""
    mpiexec = shutil.which("mpiexec")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    if mpiexec is None:
        return None
    cmd = [mpiexec, "-n", str(n), sys.executable, os.path.join(HERE, "_mpi_bench.py")] + (["--quick"] if quick else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except Exception:
        return None


# -- virtualpar ---------------------------------------------------------------------------------------
def _pingpong(dev, nbytes: int, iters: int) -> float:
    x = np.ones(nbytes, np.uint8)
    out = np.empty_like(x)
    for i in range(iters + 2):
        if i == 2:
            t = time.perf_counter()
        if dev.rank == 0:
            dev.send(x, 1)
            dev.recv(1, out=out)
        else:
            dev.recv(0, out=out)
            dev.send(x, 0)
    return (time.perf_counter() - t) / iters / 2


def _stream(dev, nbytes: int, iters: int) -> float:
    x = np.ones(nbytes, np.uint8)
    out = np.empty_like(x)
    for i in range(iters + 1):
        if i == 1:
            dev.barrier()
            t = time.perf_counter()
        if dev.rank == 0:
            dev.send(x, 1)
        else:
            dev.recv(0, out=out)
    dev.barrier()
    return nbytes * iters / (time.perf_counter() - t)


def _collective(dev, op: str, algorithm: str, nbytes: int, iters: int) -> tuple[float, float, float]:
    x = np.ones(nbytes // 4, np.float32)
    call = {
        "all_reduce": lambda: dev.all_reduce(x, algorithm=algorithm),
        "all_gather": lambda: dev.all_gather(x[: x.size // dev.size], algorithm=algorithm),
        "reduce_scatter": lambda: dev.reduce_scatter(x, algorithm=algorithm),
    }[op]
    call()
    dev.barrier()
    m0 = dev.clock
    call()
    m1 = dev.clock
    dev.barrier()
    t = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t) / iters, m0, m1


_BUS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n}


def run(quick: bool, hardware: str, mpi: bool = True) -> dict:
    memcpy = bench_memcpy()
    sizes = [4 * KIB, 256 * KIB, 16 * MIB] if quick else [4 * KIB << (2 * i) for i in range(8)]
    result: dict = {
        "date": datetime.date.today().isoformat(), "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "python": platform.python_version(), "numpy": np.__version__, "virtualpar": __version__,
        "hardware": hardware, "memcpy_Bps": memcpy, "p2p": [], "collectives": [], "mpi": {},
    }
    with VirtualCluster(2, check_collectives=False) as cluster:
        result["latency_4KiB_s"] = min(cluster.run(_pingpong, 4 * KIB, 50 if quick else 2000)[0] for _ in range(2))
        for nbytes in sizes:
            bw = cluster.run(_stream, nbytes, _iters(nbytes, quick))[1]
            result["p2p"].append({"bytes": nbytes, "Bps": bw, "ratio_memcpy": bw / memcpy})
    for n in (2, 4):
        result["mpi"][n] = bench_mpi(n, quick) if mpi else None
        with VirtualCluster(n, check_collectives=False, hardware=hardware) as cluster:
            for op, algos in (("all_reduce", ("ring", "tree", "direct")), ("all_gather", ("ring",)), ("reduce_scatter", ("ring",))):
                for algorithm in algos:
                    for nbytes in [s for s in sizes if s >= 4 * KIB * n]:
                        replies = cluster.run(_collective, op, algorithm, nbytes, _iters(nbytes, quick))
                        seconds = max(r[0] for r in replies)
                        modelled = max(r[2] for r in replies) - max(r[1] for r in replies)
                        algbw = nbytes / seconds
                        result["collectives"].append({
                            "op": op, "algorithm": algorithm, "devices": n, "bytes": nbytes, "seconds": seconds,
                            "algbw_Bps": algbw, "busbw_Bps": algbw * _BUS[op](n), "ratio_memcpy": algbw / memcpy,
                            "modelled_s": modelled,
                        })
    for check in (False, True):
        with VirtualCluster(4, check_collectives=check) as cluster:
            t = max(r[0] for r in cluster.run(_collective, "all_reduce", "ring", 4 * KIB, 20 if quick else 500))
            result[f"all_reduce_4KiB_check_{'on' if check else 'off'}_s"] = t
    t = time.perf_counter()
    with VirtualCluster(8) as cluster:
        result["startup8_s"] = time.perf_counter() - t
        cluster.run(_noop)
    result["bare_fork8_s"] = bench_bare_fork(8)
    result["targets"] = targets(result)
    return result


def _noop(dev) -> None:
    return None


def targets(r: dict) -> dict:
    """The issue's targets, each as (measured ratio or value, passed)."""
    out = {}
    big = [p for p in r["p2p"] if p["bytes"] == max(q["bytes"] for q in r["p2p"])][0]
    out["p2p_largest >= 0.7 memcpy"] = (round(big["ratio_memcpy"], 3), big["ratio_memcpy"] >= 0.7)
    out["8-device start-up <= 0.5 s"] = (round(r["startup8_s"], 3), r["startup8_s"] <= 0.5)
    for n, mpi in r["mpi"].items():
        if not mpi:
            continue
        if "latency_pickle_4KiB_s" in mpi:
            ref = mpi["latency_pickle_4KiB_s"]
            out["4KiB latency <= mpi4py pickle send/recv"] = (round(r["latency_4KiB_s"] / ref, 3), r["latency_4KiB_s"] <= ref)
        for c in r["collectives"]:
            ref = mpi.get("allreduce_algbw_Bps", {}).get(str(c["bytes"]))
            if c["op"] == "all_reduce" and c["devices"] == n and c["algorithm"] == "ring" and ref and c["bytes"] >= MIB:
                out[f"all_reduce ring n={n} {c['bytes'] // MIB} MiB >= mpi4py"] = (round(c["algbw_Bps"] / ref, 3), c["algbw_Bps"] >= ref)
    return out


def _gb(x: float) -> str:
    return f"{x / 1e9:8.3f}"


def print_table(r: dict) -> None:
    print(f"# virtualpar {r['virtualpar']} collectives benchmark | {r['date']} | {r['machine']} | python {r['python']} | numpy {r['numpy']}")
    print(f"# memcpy (numpy copyto, 64 MiB, warm): {r['memcpy_Bps'] / 1e9:.2f} GB/s; modelled hardware: {r['hardware']}")
    print(f"# 4 KiB one-way latency: {r['latency_4KiB_s'] * 1e6:.1f} us")
    print("\n# point-to-point bandwidth (2 devices)\n# size        GB/s  x memcpy")
    for p in r["p2p"]:
        print(f"{p['bytes']:>10} {_gb(p['Bps'])}  {p['ratio_memcpy']:8.3f}")
    print("\n# collectives\n# op             algo   n       size   algbw   busbw  x memcpy   wall(ms)  modelled(us)")
    for c in r["collectives"]:
        print(f"{c['op']:<16}{c['algorithm']:<7}{c['devices']:>2} {c['bytes']:>10} {_gb(c['algbw_Bps'])}{_gb(c['busbw_Bps'])}  {c['ratio_memcpy']:8.3f} "
              f"{c['seconds'] * 1e3:10.3f}  {c['modelled_s'] * 1e6:12.2f}")
    on, off = r["all_reduce_4KiB_check_on_s"], r["all_reduce_4KiB_check_off_s"]
    print(f"\n# contract check: 4 KiB all_reduce on 4 devices {off * 1e6:.1f} us without, {on * 1e6:.1f} us with ({on / off:.2f}x)")
    print(f"# start-up of 8 devices: {r['startup8_s'] * 1e3:.1f} ms (bare fork of 8 processes: {r['bare_fork8_s'] * 1e3:.1f} ms, "
          f"{r['startup8_s'] / r['bare_fork8_s']:.1f}x)")
    for n, mpi in r["mpi"].items():
        print(f"# mpi4py n={n}: " + (json.dumps(mpi) if mpi else "not available (pip install mpi4py mpich)"))
    print("\n# targets")
    for name, (value, ok) in r["targets"].items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few sizes, few iterations (smoke test)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--hardware", default="h100-node", help="preset for the modelled column")
    parser.add_argument("--no-mpi", action="store_true", help="skip the mpi4py reference even if installed")
    args = parser.parse_args(argv)
    result = run(args.quick, args.hardware, mpi=not args.no_mpi)
    if args.json:
        print(json.dumps(result, default=str))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
