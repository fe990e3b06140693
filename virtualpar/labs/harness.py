"""Running a student's function on virtual clusters, and saying what went wrong in a student's terms.

:func:`run_student` runs ``fn(dev, *args[rank])`` on every device of a fresh cluster (each device
gets its own arguments), in the mode a check asks for: strict (``eager_limit=0``: a send completes
only once its receive is posted, so code that relies on buffering deadlocks, and the deadlock is
named), shuffled (seeded pauses before sends and receives, so arrival-order races show), or plain.
It never raises for the student's mistakes: a :class:`Run` carries the results or the error, the
traffic and the trace.  :func:`compare` names the first wrong element per device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .. import Mesh, VirtualCluster
from ..errors import DeviceError, VirtualParError
from .student import RuledDevice, student_traceback

__all__ = ["Run", "run_student", "compare", "describe", "noncontiguous", "side_by_side", "MODES"]

#: name -> cluster options; every correctness check runs in each of them
MODES: dict[str, dict[str, Any]] = {
    "plain": {},
    "strict (eager_limit=0)": {"eager_limit": 0},
    "shuffled (seed 1)": {"shuffle": 1},
    "shuffled (seed 7)": {"shuffle": 7},
}


@dataclass
class Run:
    """One run of the student's (or the reference's) function on one cluster."""

    mesh: Mesh
    mode: str
    results: list[Any] | None = None
    error: BaseException | None = None
    sent: tuple[int, ...] = ()  # payload bytes each device sent
    messages: tuple[int, ...] = ()  # messages each device sent
    bytes: Any = None  # bytes[s, d]: payload bytes device s sent to device d
    clocks: tuple[float, ...] = ()  # modelled seconds per device
    calls: list[list[tuple[str, tuple[int, ...]]]] | None = None  # per device: (collective, shape)
    trace: Any = None

    @property
    def ok(self) -> bool:
        return self.error is None


def noncontiguous(x: np.ndarray) -> np.ndarray:
    """The same values as ``x`` in a strided (non-contiguous) view, as a slice of a larger array."""
    wide = np.zeros(np.shape(x) + (2,), dtype=np.asarray(x).dtype)
    wide[..., 0] = x
    return wide[..., 0]


def _call(dev: Any, fn: Callable[..., Any], per_rank: Sequence[tuple], forbidden: tuple[str, ...], rule: str,
          strided: bool) -> tuple[Any, list]:
    args = per_rank[dev.rank]
    if strided:
        args = tuple(noncontiguous(a) if isinstance(a, np.ndarray) and a.ndim else a for a in args)
    ruled = RuledDevice(dev, forbidden, rule)
    return fn(ruled, *args), ruled.calls


def run_student(fn: Callable[..., Any], per_rank: Sequence[tuple], mesh: Mesh | dict[str, int], *,
                mode: str = "plain", forbidden: Sequence[str] = (), rule: str = "", strided: bool = False,
                hardware: str | None = "h100-node", timeout: float = 5.0, run_timeout: float = 30.0,
                trace: bool = False) -> Run:
    """Run ``fn(dev, *per_rank[dev.rank])`` on a new cluster of ``mesh`` in ``mode`` (a key of
    :data:`MODES`); the cluster is closed before returning, whatever happened."""
    mesh = mesh if isinstance(mesh, Mesh) else Mesh(dict(mesh))
    run = Run(mesh=mesh, mode=mode)
    options = dict(MODES[mode], timeout=timeout, run_timeout=run_timeout, hardware=hardware, trace=trace)
    try:
        with VirtualCluster(mesh, **options) as cluster:
            try:
                pairs = cluster.run(_call, fn, list(per_rank), tuple(forbidden), rule, strided)
                run.results, run.calls = [p[0] for p in pairs], [p[1] for p in pairs]
            except VirtualParError as exc:
                run.error = exc
            if run.error is None or not cluster.closed:
                stats = cluster.stats()
                run.sent = tuple(int(stats.sent(r)) for r in range(mesh.size))
                run.messages = tuple(int(m) for m in stats.messages.sum(axis=1))
                run.bytes = stats.bytes
                run.clocks = tuple(cluster.clocks())
                run.trace = cluster.trace() if trace else None
    except VirtualParError as exc:  # the cluster could not even report (it died with the run)
        run.error = run.error or exc
    return run


def describe(exc: BaseException, path: str | None = None) -> str:
    """The error as a student should read it: its name and message, then the frames of their own
    file in the device's traceback (all of it if ``path`` is None)."""
    text = f"{type(exc).__name__}: {str(exc).strip()}"
    cause = exc.__cause__
    if isinstance(exc, DeviceError) and cause is not None:
        remote = str(cause).strip()
        text += "\n" + (student_traceback(remote, path) if path else remote)
    return text


def compare(results: Sequence[Any], expected: Sequence[np.ndarray], mesh: Mesh, *, rtol: float = 1e-6,
            atol: float = 0.0, what: str = "result") -> list[str]:
    """One line per device whose result differs from ``expected[rank]``: wrong type, shape, dtype,
    or the first element that differs (index, expected, got) and how many do."""
    problems = []
    for rank, (got, want) in enumerate(zip(results, expected)):
        who = f"device {rank} {mesh.index(rank)}"
        if not isinstance(got, np.ndarray):
            problems.append(f"{who} returned {type(got).__name__}, expected a numpy "
                            f"array of shape {want.shape}")
            continue
        if got.shape != want.shape:
            problems.append(f"{who} returned shape {got.shape}, expected {want.shape}")
            continue
        if got.dtype != want.dtype:
            problems.append(f"{who} returned dtype {got.dtype}, expected {want.dtype} (the input's)")
            continue
        bad = ~np.isclose(got, want, rtol=rtol, atol=atol) if want.dtype.kind in "fc" else got != want
        if np.any(bad):
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            problems.append(f"{who}: {what} differs at index {first}: expected "
                            f"{want[first]!r}, got {got[first]!r} "
                            f"({int(bad.sum())} of {bad.size} elements differ)")
    return problems


def side_by_side(report: Any, runs: Sequence[tuple[str, Run]], what: str, width: int = 100,
                 png: str | None = None) -> None:
    """The traced runs (``("your run", run), ("the reference", run)``) as text timelines on the
    modelled clock in ``report.timeline``, and as PNG Gantt charts in the folder ``png`` if given."""
    import os

    parts = []
    for label, run in runs:
        if run.trace is None:
            continue
        parts.append(f"{label} ({what}, modelled clock):\n{run.trace.to_text(width=width)}")
        if png:
            path = os.path.join(png, f"{report.lab}-{label.split()[-1]}.png")
            run.trace.to_png(path, title=f"{report.lab}: {label} ({what})")
            report.pictures.append(path)
    report.timeline = "\n\n".join(parts)
