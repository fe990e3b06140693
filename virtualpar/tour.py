"""``virtualpar tour``: every collective on a small mesh, checked against numpy, with a trace.

The tour starts a 2x2 ``(dp, tp)`` mesh (or the mesh it is given), runs each collective over each
kind of group (each mesh axis of more than one device, then all devices) on real arrays, checks every device's
result against the single-process numpy oracle, and tabulates what moved and what it would cost on the
modelled hardware.  It then writes the run's trace (Chrome JSON for Perfetto) and prints a text timeline.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable, TextIO

import numpy as np

from .collectives import ALGORITHMS, reference
from .errors import UsageError
from .mesh import Mesh
from .runtime import VirtualCluster
from .trace.fmt import nbytes as format_bytes
from .trace.fmt import seconds

__all__ = ["run_tour", "tour_collectives", "TourRow", "TOUR_CASES", "TOUR_SECTIONS"]

# Later parts of the tour, in order: "module:function" names, imported when the tour reaches them.
# Each function takes (out: TextIO, hardware: str | None) and returns True when every check it
# made passed; it appears in the rows as op "section", group = its title.
TOUR_SECTIONS: tuple[tuple[str, str], ...] = (
    ("Tensor parallelism: sharding policies", "virtualpar.commands.tour_tensor_parallel:tour_section"),
    ("Pipeline parallelism: a 1F1B run", "virtualpar.commands.pipeline_demo:tour_section"),
    ("One scheme for every training strategy", "virtualpar.commands.tour_strategies:tour_section"),
    ("Timeline parallelism: an RNN split along time", "virtualpar.commands.tour_timeline:tour_section"),
)


@dataclass(frozen=True)
class TourRow:
    op: str
    group: str
    algorithm: str
    nbytes: int
    modelled: float
    correct: bool


def _input(rank: int, shape: tuple[int, ...] = (4, 6)) -> np.ndarray:
    return np.random.default_rng(1000 + rank).standard_normal(shape).astype(np.float32)


# (op, device-call, oracle) — the device call gets (dev, x, group, algorithm); the oracle gets the
# inputs of one group and returns every member's expected output.
TOUR_CASES: dict[str, tuple[Callable[..., Any], Callable[[list[np.ndarray]], list[Any]]]] = {
    "all_reduce": (lambda d, x, g, a: d.all_reduce(x, group=g, algorithm=a),
                   lambda xs: reference.all_reduce(xs)),
    "all_gather": (lambda d, x, g, a: d.all_gather(x, dim=1, group=g, algorithm=a),
                   lambda xs: reference.all_gather(xs, dim=1)),
    "reduce_scatter": (lambda d, x, g, a: d.reduce_scatter(x, dim=0, group=g, algorithm=a),
                       lambda xs: reference.reduce_scatter(xs, dim=0)),
    "broadcast": (lambda d, x, g, a: d.broadcast(x, root=1, group=g, algorithm=a),
                  lambda xs: reference.broadcast(xs, root=1)),
    "reduce": (lambda d, x, g, a: d.reduce(x, root=0, op="max", group=g, algorithm=a),
               lambda xs: reference.reduce(xs, root=0, op="max")),
    "gather": (lambda d, x, g, a: d.gather(x, root=0, dim=0, group=g, algorithm=a),
               lambda xs: reference.gather(xs, root=0, dim=0)),
    "scatter": (lambda d, x, g, a: d.scatter(x, root=0, dim=1, group=g, algorithm=a),
                lambda xs: reference.scatter(xs, root=0, dim=1)),
    "all_to_all": (lambda d, x, g, a: d.all_to_all(x, split_dim=1, concat_dim=0, group=g, algorithm=a),
                   lambda xs: reference.all_to_all(xs, split_dim=1, concat_dim=0)),
}


def _device_step(dev: Any, op: str, group: Any, algorithm: str) -> tuple[Any, float, float]:
    """One collective on one device; returns (result, modelled clock before, after)."""
    x = _input(dev.rank)
    dev.barrier()
    t0 = dev.clock
    result = TOUR_CASES[op][0](dev, x, group, algorithm)
    return result, t0, dev.clock


def tour_collectives(dev: Any) -> list[tuple[str, str, str, bool]]:
    """The tour's collectives as one program of the device protocol, checked on the device itself:
    every case of :data:`TOUR_CASES` on every group of the tour, with the default algorithm and
    with each message algorithm; returns ``(op, group, algorithm, matches numpy)`` per call.  It
    runs unchanged on the emulator and under ``mpiexec`` (``virtualpar run
    virtualpar/tour.py:tour_collectives``), where the default is MPI's own collective."""
    axes = dev.mesh.axis_names
    rows = []
    for op, (call, oracle) in TOUR_CASES.items():
        for group in [None, *axes]:
            ranks = dev.group(group)
            want = oracle([_input(r) for r in ranks])[ranks.index(dev.rank)]
            for algorithm in [None, *(a for a in ALGORITHMS[op] if a != "shm")]:
                got = call(dev, _input(dev.rank), group, algorithm)
                ok = (want is None and got is None) or (
                    want is not None and got is not None and got.shape == want.shape
                    and bool(np.allclose(got, want, rtol=1e-5, atol=1e-5)))
                rows.append((op, group or "all", algorithm or "default", ok))
    return rows


def _imbalanced_step(dev: Any) -> None:
    """Unequal compute, then a gradient all_reduce: the timeline shows who waits for whom."""
    dev.compute(flops=(dev.rank + 1) * 20e9, bytes=0, name="forward+backward")
    dev.all_reduce(np.zeros(16 << 20, np.float32))


def _check(mesh: Mesh, op: str, group: Any, results: list[Any]) -> bool:
    for ranks in mesh.groups(group):
        expected = TOUR_CASES[op][1]([_input(r) for r in ranks])
        for r, want in zip(ranks, expected):
            got = results[r]
            if (want is None) != (got is None):
                return False
            if want is not None and not (
                got.shape == want.shape and np.allclose(got, want, rtol=1e-5, atol=1e-5)
            ):
                return False
    return True


def run_tour(out: TextIO, trace_path: str = "virtualpar-trace.json", hardware: str | None = "h100-node",
             mesh: Mesh | None = None) -> list[TourRow]:
    """Run the tour, print its table to ``out``, write the trace; returns the rows."""
    mesh = mesh or Mesh({"dp": 2, "tp": 2})
    if mesh.size < 2:
        raise UsageError("the tour needs a mesh of at least 2 devices (its collectives "
                         "have a root at position 1); "
                         f"got {mesh}")
    # one group per mesh axis with more than one device, innermost first, then every device
    # (an axis spanning every device is the group "all" itself: shown once)
    groups = [(a,
               a) for a in reversed(mesh.axis_names) if 1 < mesh.axis_size(a) < mesh.size] + [(None, "all")]
    rows: list[TourRow] = []
    with VirtualCluster(mesh, hardware=hardware) as cluster:
        out.write(f"virtualpar tour: {mesh.size} device processes on mesh {mesh}, modelled "
                  f"hardware: {hardware}\n\n")
        for op in TOUR_CASES:
            for algorithm in ALGORITHMS[op]:
                for group, label in groups:
                    cluster.reset_stats()
                    replies = cluster.run(_device_step, op, group, algorithm)
                    results = [r[0] for r in replies]
                    nbytes = cluster.stats().total_bytes  # the barrier moves 0-byte messages only
                    # the op's modelled time: from the last device entering to the last leaving
                    modelled = max(r[2] for r in replies) - max(r[1] for r in replies)
                    rows.append(TourRow(op, label, algorithm, nbytes, modelled,
                                        _check(mesh, op, group, results)))
        trace = cluster.trace(clear=True)
        cluster.run(_imbalanced_step)
        demo = cluster.trace()
    _print_table(out, rows)
    path = trace.write_chrome(trace_path, clock="model")
    out.write(f"\ntrace ({len(trace)} events, modelled clock) written to\n  {os.path.abspath(path)}\n")
    out.write("  open it in https://ui.perfetto.dev (Open trace file) or chrome://tracing\n\n")
    out.write("One training-like step: device r computes (r+1) x 20 GFLOP, then all "
              "devices all_reduce 64 MiB\n")
    out.write("of gradients. The fast devices enter the all_reduce early and wait inside it ('=') for the\n")
    out.write("slowest, whose compute is the critical path:\n\n")
    out.write(demo.filter(kind=("collective", "compute")).to_text(clock="model", width=78) + "\n\n")
    out.write(demo.summary(clock="model").format(max_path=6) + "\n")
    bad = [r for r in rows if not r.correct]
    out.write(f"\n{len(rows) - len(bad)} of {len(rows)} collective runs match numpy on every device.\n")
    for title, target in TOUR_SECTIONS:
        out.write(f"\n== {title} " + "=" * max(0, 74 - len(title)) + "\n\n")
        module, _, func = target.partition(":")
        ok = bool(getattr(importlib.import_module(module), func)(out, hardware))
        rows.append(TourRow("section", title, "-", 0, 0.0, ok))
    return rows


def _print_table(out: TextIO, rows: list[TourRow]) -> None:
    head = f"{'op':<15}{'group':<7}{'algorithm':<10}{'bytes moved':>12}{'modelled':>12}  correct"
    out.write(head + "\n" + "-" * len(head) + "\n")
    for r in rows:
        out.write(f"{r.op:<15}{r.group:<7}{r.algorithm:<10}{format_bytes(r.nbytes):>12}"
                  f"{seconds(r.modelled):>12}  {'yes' if r.correct else 'NO'}\n")
