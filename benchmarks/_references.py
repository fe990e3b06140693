"""The yardsticks ``bench_collectives.py`` measures in the same run: memcpy, a bare fork, mpi4py, gloo.

Absolute numbers on a shared 2-core VM mean little; ratios against a reference measured minutes
apart on the same machine mean more.  mpi4py and torch are optional: when they are missing (or
fail) the reference is reported as skipped with the reason, never as an error.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

__all__ = ["memcpy", "bare_fork_startup", "run_mpi4py", "run_gloo", "module_version"]

HERE = os.path.dirname(os.path.abspath(__file__))


def module_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or None — without importing it (importing
    torch into the benchmark's own process would slow every fork that follows)."""
    if importlib.util.find_spec(name) is None:
        return None
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def memcpy(nbytes: int, budget: float, repeats: int) -> dict[str, float]:
    """numpy ``copyto`` bandwidth for ``nbytes``: into a warm (reused) and into a fresh destination.

    *warm*: both buffers allocated and touched once, then copied repeatedly — what a transport that
    receives into a reused ``out=`` buffer competes with.  *fresh*: a new ``np.empty`` per copy, so
    every page of the destination is faulted in during the copy (on this VM the first touch of
    never-used guest memory runs at ~0.4 GB/s, which makes this figure bimodal).  GB/s = 1e9 B/s.
    """
    src = np.full(nbytes, 7, np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    t = _timeit(lambda: np.copyto(dst, src))
    iters = max(1, min(10_000, int(budget / max(t, 1e-7))))
    warm = [nbytes / _timeit(lambda: np.copyto(dst, src), iters) / 1e9 for _ in range(repeats)]

    def fresh_copy() -> None:
        np.copyto(np.empty(nbytes, np.uint8), src)

    fresh = [nbytes / _timeit(fresh_copy, max(1, min(iters, 50))) / 1e9 for _ in range(repeats)]
    return {"bytes": nbytes, "warm_GBps": statistics.median(warm), "fresh_GBps": statistics.median(fresh),
            "warm_samples": warm, "fresh_samples": fresh}


def _timeit(fn: Any, iters: int = 1) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def _bare_child(conn: Any) -> None:
    conn.send("ready")
    conn.send(conn.recv())  # echo the one message
    conn.close()


def bare_fork_startup(n: int) -> float:
    """Seconds for ``multiprocessing`` (fork) to start ``n`` processes that each exchange one message
    with the parent — the floor any process-per-device runtime starts from."""
    ctx = mp.get_context("fork")
    t0 = time.perf_counter()
    pipes = [ctx.Pipe() for _ in range(n)]
    procs = [ctx.Process(target=_bare_child, args=(child,), daemon=True) for _, child in pipes]
    for p in procs:
        p.start()
    for parent, _ in pipes:
        parent.recv()
    for parent, _ in pipes:
        parent.send("go")
    for parent, _ in pipes:
        parent.recv()
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join()
    for parent, child in pipes:
        parent.close()
        child.close()
    return elapsed


def reference_parser() -> argparse.ArgumentParser:
    """The command line that ``run_mpi4py`` / ``run_gloo`` pass to ``_mpi_bench.py`` / ``_gloo_bench.py``."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", required=True, help="message sizes in bytes, comma-separated")
    ap.add_argument("--budget", type=float, default=0.15, help="seconds per repeat of one measurement")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of each measurement (median)")
    ap.add_argument("--p2p", action="store_true", help="also measure point-to-point latency and bandwidth")
    ap.add_argument("--quick", action="store_true", help="smoke run: one iteration")
    return ap


def _run_json(cmd: list[str], timeout: float) -> dict[str, Any]:
    """Run ``cmd``; its last stdout line is a JSON object.  Errors become ``{"skipped": reason}``."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=HERE)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"skipped": f"{cmd[0]} failed: {exc}"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"skipped": f"exit code {proc.returncode}: {' | '.join(tail)}"}
    return json.loads(lines[-1])


def _mpiexec() -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else shutil.which("mpiexec")


def run_mpi4py(n: int, sizes: list[int], budget: float, repeats: int, p2p: bool) -> dict[str, Any]:
    """mpi4py under ``mpiexec -n n`` (see ``_mpi_bench.py``); ``{"skipped": why}`` if unavailable."""
    if module_version("mpi4py") is None:
        return {"skipped": "mpi4py is not installed (pip install mpi4py mpich)"}
    exe = _mpiexec()
    if exe is None:
        return {"skipped": "mpi4py is installed but no mpiexec was found"}
    cmd = [exe, "-n", str(n), sys.executable, os.path.join(HERE, "_mpi_bench.py"),
           "--sizes", ",".join(map(str, sizes)), "--budget", str(budget), "--repeats", str(repeats)]
    if p2p:
        cmd.append("--p2p")
    return _run_json(cmd, timeout=600)


def run_gloo(n: int, sizes: list[int], budget: float, repeats: int, p2p: bool) -> dict[str, Any]:
    """torch.distributed with the gloo backend on ``n`` processes (see ``_gloo_bench.py``)."""
    if module_version("torch") is None:
        return {"skipped": "torch is not installed (pip install torch==2.13.0 gives a CPU build here)"}
    cmd = [sys.executable, os.path.join(HERE, "_gloo_bench.py"), "-n", str(n),
           "--sizes", ",".join(map(str, sizes)), "--budget", str(budget), "--repeats", str(repeats)]
    if p2p:
        cmd.append("--p2p")
    return _run_json(cmd, timeout=600)


def memcpy_Bps(nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """This machine's memcpy bandwidth in bytes per second (``np.copyto`` of ``nbytes``, warm): what
    the benchmarks' floors charge every byte a step moves."""
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    t0 = time.perf_counter()
    for _ in range(repeats):
        np.copyto(dst, src)
    return repeats * src.nbytes / (time.perf_counter() - t0)


def time_slot_writes(mine: Any, reps: int) -> tuple[float, int]:
    """On a device: the median time of writing ``mine`` (its part of a committed state) into a slot
    file, as each committed step does (``checkpoint/spill.py``), into a file of its own in the same
    place — the first write, which gives the file its pages, untimed, as the step's slots keep
    theirs — and the file's bytes."""
    import tempfile

    from virtualpar.checkpoint.spill import _directory, write_slot

    if not mine:
        return 0.0, 0
    with tempfile.TemporaryFile(dir=_directory()) as f:
        write_slot(f.fileno(), 1, mine)
        times = []
        for i in range(reps):
            t0 = time.perf_counter()
            write_slot(f.fileno(), i + 2, mine)
            times.append(time.perf_counter() - t0)
        return statistics.median(times), os.fstat(f.fileno()).st_size
