"""``virtualpar doctor [-n N] [--json]``: can this machine run virtual clusters, and how well?

What a user of ``ompi_info`` or ``torch.utils.collect_env`` expects, plus a live check: the
environment (Python, cores, memory, the BLAS, the packages, ``/dev/shm``, start methods), then a
cluster of ``N`` devices started and measured — start-up time, an all_reduce checked against numpy,
the one-way latency of a 4 KiB message, whether a large message is copied straight out of its
sender's memory (``process_vm_readv``; a ptrace policy may forbid it, and the rings then carry it),
resident memory per device, and that closing it leaves no process and no shared memory behind.

Every module of virtualpar is imported too (:mod:`._imports`): a missing requirement is a FAIL
naming the ``pip install`` that brings it, a missing extra a WARN naming what it disables.

Each finding is ``OK``, ``WARN`` (works, but slower or without an extra) or ``FAIL`` (a cluster
cannot work); the exit code is 1 if anything failed.
"""

from __future__ import annotations

from ..trace.fmt import WIDTH, fit, nbytes, seconds

import argparse
import importlib
import json
import multiprocessing as mp
import os
import platform
import shutil
import sys
import time
from typing import Any

from ._args import positive_int
from ._imports import import_findings, requirements

__all__ = ["register", "environment", "live"]

Finding = tuple[str, str, str]  # (OK | WARN | FAIL, what, detail)
_REQUIRED = ("numpy", "networkx", "autograd", "scipy", "cloudpickle", "threadpoolctl")
_EXTRAS = {"matplotlib": "PNG timelines: pip install 'virtualpar[viz]'",
           "mpi4py": "real MPI runs and MPICH references: pip install 'virtualpar[mpi]'"}


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "installed"


def _gib(n: float) -> str:
    return nbytes(n, digits=3)


def environment() -> list[Finding]:
    """What this machine offers, checked without starting a process."""
    found: list[Finding] = []
    ok_python = sys.version_info >= (3, 9)
    found.append(("OK" if ok_python else "FAIL", "python",
                  f"{platform.python_version()} on {platform.system()}"))
    cores = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    found.append(("OK" if usable > 1 else "WARN", "cores", f"{cores} ({usable} usable by this process); "
                  "devices beyond that share them, which is expected and costs wall time only"))
    mem = _meminfo()
    if mem:
        avail = mem.get("MemAvailable", 0)
        found.append(("OK" if avail >= 2 ** 30 else "WARN", "memory",
                      f"{_gib(avail)} available of {_gib(mem.get('MemTotal', 0))}"))
    reqs = requirements()
    for name in _REQUIRED:
        try:
            importlib.import_module(name)
            found.append(("OK", name, _version(name)))
        except ImportError:
            found.append(("FAIL", name, f"missing: python -m pip install \"{reqs.get(name, name)}\""))
        except Exception as exc:  # an installed package that breaks on import (old autograd, numpy 2)
            found.append(("FAIL", name, f"{_version(name)} fails to import ({type(exc).__name__}: {exc}); "
                          f"virtualpar requires {reqs.get(name, name)}: python -m pip install -U "
                          f"\"{reqs.get(name, name)}\""))
    try:
        from threadpoolctl import threadpool_info

        blas = [f"{i.get('internal_api')} {i.get('version') or ''} ({i.get('num_threads')} "
                "threads)".replace("  ", " ")
                for i in threadpool_info() if i.get("user_api") == "blas"]
        found.append(("OK" if blas else "WARN", "blas", ", ".join(blas) or "numpy reports no BLAS library"))
    except Exception as exc:  # threadpoolctl inspects native libraries: never let it end the report
        found.append(("WARN", "blas", f"could not inspect ({exc})"))
    for name, why in _EXTRAS.items():
        try:
            importlib.import_module(name)
            found.append(("OK", name, _version(name)))
        except ImportError:
            found.append(("WARN", name, f"not installed; needed for {why}"))
        except Exception as exc:  # installed but broken: the extra's features will fail the same way
            found.append(("WARN", name, f"fails to import ({type(exc).__name__}: {exc}); needed for {why}"))
    found.extend(import_findings())
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = mpiexec if os.path.exists(mpiexec) else shutil.which("mpiexec")
    found.append(("OK" if mpiexec else "WARN", "mpiexec",
                  mpiexec or "not found (the mpich wheel provides it)"))
    found.append(_shm())
    found.append(("OK" if "fork" in mp.get_all_start_methods() else "WARN", "start methods",
                  ", ".join(mp.get_all_start_methods())))
    return found


def _shm() -> Finding:
    path = "/dev/shm"
    if not os.path.isdir(path) or not os.access(path, os.W_OK):
        return ("FAIL", "/dev/shm", "missing or not writable: clusters keep their channels there")
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    return ("OK" if free >= 2 ** 30 else "WARN", "/dev/shm",
            f"{_gib(free)} free (each cluster's channels and scratch "
            "live there, backed as they are used)")


def _ping(dev: Any, rounds: int) -> float:
    """Median one-way time of a 4 KiB message between devices 0 and 1 (a ping-pong, halved)."""
    import numpy as np

    x, times = np.zeros(512), []
    for _ in range(rounds):
        t0 = time.perf_counter()
        if dev.rank == 0:
            dev.send(x, 1)
            dev.recv(1)
        elif dev.rank == 1:
            dev.recv(0)
            dev.send(x, 0)
        times.append((time.perf_counter() - t0) / 2)
    return float(np.median(times))


def _direct_copy(dev: Any) -> bool | None:
    """Device 1 receives 8 MiB from device 0 (past the rings, so offered): could it read it straight
    from device 0's memory?"""
    import numpy as np

    if dev.rank == 0:
        dev.send(np.ones(1 << 20), 1)
    elif dev.rank == 1:
        dev.recv(0)
        return bool(dev._core.endpoint.can_read)
    return None


def live(n: int) -> list[Finding]:
    """Start a cluster of ``n`` devices, measure it, close it, and look for what it left behind."""
    import numpy as np

    from .. import VirtualCluster

    found: list[Finding] = []
    before = _segments()
    t0 = time.perf_counter()
    cluster = VirtualCluster(n, timeout=30)
    try:
        ready = time.perf_counter() - t0
        cluster.clocks()  # the first call that needs the devices waits for their warm-up (none for 1 device)
        warm = f", warmed up after {seconds(time.perf_counter() - t0)}" if n > 1 else ""
        found.append(("OK", "start", f"{n} device{'s' if n > 1 else ''} ready in {seconds(ready)}{warm}"))
        name, pids = cluster._arena.name, list(cluster.pids)
        got = cluster.run(lambda dev: dev.all_reduce(np.full(1024, dev.rank + 1.0)))
        right = all(np.array_equal(g, np.full(1024, n * (n + 1) / 2)) for g in got)
        found.append(("OK" if right else "FAIL", "all_reduce",
                      "equals numpy's sum on every device" if right else
                      "differs from numpy's sum: please report it"))
        if n > 1:
            cluster.run(_ping, 20)  # warm
            one_way = cluster.run(_ping, 200)[0]
            found.append(("OK", "latency", f"{seconds(one_way)} one way for 4 KiB (median of 200)"))
            direct = cluster.run(_direct_copy)[1]
            found.append(("OK", "large messages",
                          "copied straight from the sender's memory (process_vm_readv)")
                         if direct else ("WARN", "large messages",
                                         "streamed through the rings: this kernel's "
                                         "ptrace policy forbids process_vm_readv (correct, somewhat slower)"))
        mem = cluster.resident_memory()
        pss = [m["pss"] for m in mem]
        found.append(("OK", "memory per device", f"PSS {_mib(min(pss))}–{_mib(max(pss))}, "
                      f"{_mib(sum(pss))} for all {n} (RSS {_mib(max(m['rss'] for m in mem))} at most)"))
    finally:
        t1 = time.perf_counter()
        cluster.close()
    left = [p for p in pids if os.path.exists(f"/proc/{p}") and _state(p) != "Z"]
    # the segment's name is unlinked once every device mapped it: look for any this process made and left
    leaked = sorted(_segments() - before) or os.path.exists(os.path.join("/dev/shm", name))
    clean = not left and not leaked
    found.append(("OK" if clean else "FAIL", "close", f"in {seconds(time.perf_counter() - t1)}; " + (
        "no process and no shared memory "
        "left" if clean else f"left processes {left}, shared memory {leaked}")))
    return found


def _segments() -> set[str]:
    """This process's clusters' shared-memory names present in /dev/shm."""
    prefix = f"virtualpar-{os.getpid()}-"
    try:
        return {e for e in os.listdir("/dev/shm") if e.startswith(prefix)}
    except OSError:
        return set()


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def _mib(n: float) -> str:
    return nbytes(n, digits=3)


def _lines(findings: list[Finding], width: int = WIDTH) -> str:
    """One finding a line, ``  STATUS what  detail``, the detail wrapped under itself within ``width``."""
    pad = 2 + 6 + 19
    out = []
    for status, what, detail in findings:
        parts = fit(detail, width - pad)
        out.append(f"  {status:<5} {what:<18} {parts[0]}")
        out += [" " * pad + part for part in parts[1:]]
    return "\n".join(out)


def _doctor(args: argparse.Namespace) -> int:
    from .. import __version__

    findings = environment()
    live_findings: list[Finding] = []
    try:
        live_findings = live(args.n)
    except Exception as exc:  # the report must come out whatever broke
        live_findings = [("FAIL", "live cluster", f"{type(exc).__name__}: {exc}")]
    if args.json:
        print(json.dumps({"virtualpar": __version__,
                          "environment": [dict(zip(("status", "what", "detail"), f))
                                                                    for f in findings],
                          "live": [dict(zip(("status", "what", "detail"), f)) for f in live_findings]}))
    else:
        print(f"virtualpar doctor: virtualpar {__version__}")
        print(_lines(findings))
        print(f"  live cluster of {args.n} devices:")
        print(_lines(live_findings))
    return 1 if any(f[0] == "FAIL" for f in findings + live_findings) else 0


def register(sub) -> None:
    p = sub.add_parser("doctor", help="check that this machine can run clusters, and measure one")
    p.add_argument("-n", type=positive_int, default=4, help="devices of the live check (default 4)")
    p.add_argument("--json", action="store_true", help="the findings as JSON")
    p.set_defaults(func=_doctor)
