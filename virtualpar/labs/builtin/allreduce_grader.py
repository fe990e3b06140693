"""The grading shared by the all-reduce labs: correctness on awkward cases, safety, rules, cost.

Every device ``r`` gets its own ``x_r``; each must return ``sum_r x_r`` with ``x``'s shape and
dtype.  Cost is judged on the busiest device, because the slowest link sets an all-reduce's time:
a ring sends ``2(n-1)/n * M`` bytes from every device (M = the bytes of ``x``), a gather to one
device and a broadcast back send ``(n-1) * M`` from that device — ``n/2`` times as much.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ...mesh import Mesh
from ..harness import MODES, Run, compare, describe, run_student, side_by_side
from ..lab import CheckOptions
from ..report import Report
from ..student import COLLECTIVES, StudentFunction, broke_rule

__all__ = ["Case", "Grader"]

RULE = "this lab asks you to build it from send/recv (dev.send, dev.recv, dev.isend, dev.irecv)"
WHY = {"strict "
       "(eager_limit=0)": "in strict mode a send completes only once its receive is posted: code where "
                                 "every device sends before it receives waits forever",
       "shuffled (seed 1)": "in shuffled mode messages arrive in a seeded random order and timing",
       "shuffled (seed 7)": "in shuffled mode messages arrive in a seeded random order and timing"}


class Case:
    """One hidden case: ``n`` devices, each with its own array of ``shape`` and ``dtype``."""

    def __init__(self, n: int, shape: tuple[int, ...], dtype: str, strided: bool = False,
                 seed: int = 0) -> None:
        self.n, self.shape, self.dtype, self.strided, self.seed = n, shape, np.dtype(dtype), strided, seed

    def __repr__(self) -> str:
        extra = ", non-contiguous" if self.strided else ""
        return f"{self.n} device(s), x of shape {self.shape} {self.dtype}{extra}"

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def per_rank(self) -> list[tuple[np.ndarray]]:
        rng = np.random.default_rng(self.seed + 101 * self.n)
        if self.dtype.kind == "i":
            return [(rng.integers(-50, 50, self.shape).astype(self.dtype),) for _ in range(self.n)]
        return [(rng.standard_normal(self.shape).astype(self.dtype),) for _ in range(self.n)]

    def expected(self) -> list[np.ndarray]:
        total = np.sum([x for (x,) in self.per_rank()], axis=0, dtype=self.dtype)
        return [np.asarray(total, dtype=self.dtype)] * self.n


class Grader:
    """Grades one student function (and compares it with the lab's reference) on all-reduce cases."""

    def __init__(self, report: Report, student: StudentFunction, reference: StudentFunction,
                 options: CheckOptions) -> None:
        self.report, self.student, self.reference, self.options = report, student, reference, options
        self.rule_broken: Run | None = None
        self.ran_clean = False

    def run(self, fn: StudentFunction, case: Case, mode: str = "plain",
            trace: bool = False) -> tuple[Run, list[str]]:
        run = run_student(fn, case.per_rank(), Mesh({"world": case.n}), mode=mode, forbidden=COLLECTIVES,
                          rule=RULE, strided=case.strided, trace=trace)
        if not run.ok:
            if broke_rule(run.error):
                self.rule_broken = self.rule_broken or run
            return run, [f"{case}, {mode}: {describe(run.error, fn.path)}"]
        self.ran_clean = True
        rtol = 1e-5 if case.dtype == np.float32 else 1e-10
        atol = 1e-6 if case.dtype.kind == "f" else 0.0
        found = compare(run.results, case.expected(), run.mesh, rtol=rtol, atol=atol)
        return run, [f"{case}, {mode}: {p}" for p in found]

    def correctness(self, groups: Sequence[tuple[str, Sequence[Case]]]) -> None:
        for name, cases in groups:
            problems = [found for case in cases for found in self.run(self.student, case)[1]]
            self.report.add(name, not problems, output=_summary(problems))
        broken = self.rule_broken
        self.report.add("rules: no collectives", broken is None and self.ran_clean,
                        output=(describe(broken.error, self.student.path) if broken else
                                "" if self.ran_clean else "not judged: no case ran to the end"))

    def safety(self, case: Case) -> None:
        modes = [mode for mode in MODES if mode != "plain"]
        for mode in modes[:2] if self.options.quick else modes:
            problems = self.run(self.student, case, mode)[1]
            self.report.add(f"safe: {mode}", not problems,
                            output=_summary(problems) + (f"\n({WHY[mode]})" if problems else ""))

    def timelines(self, case: Case) -> tuple[Run, Run]:
        """Both runs of ``case`` with a trace, side by side in the report (text, and PNG if asked)."""
        mine, _ = self.run(self.student, case, trace=True)
        ref, _ = self.run(self.reference, case, trace=True)
        side_by_side(self.report, [("your run", mine), ("the reference", ref)], repr(case),
                     self.options.width, self.options.png)
        return mine, ref

    def cost(self, case: Case, optimum_bytes: float, formula: str, time_slack: float = 1.25) -> None:
        """The busiest device's bytes against ``optimum_bytes``, and modelled time against the reference's."""
        mine, ref = self.timelines(case)
        if not mine.ok:
            self.report.add("cost: bytes sent by the busiest device", False,
                            output="not judged: the run failed")
            self.report.add("cost: modelled time against virtualpar's reference", False,
                            output="not judged: the run failed")
            return
        busiest = max(range(case.n), key=lambda r: mine.sent[r])
        ratio = mine.sent[busiest] / optimum_bytes
        self.report.add("cost: bytes sent by the busiest device", ratio <= 1.05,
                        output=f"your all-reduce: device {busiest} sent "
                               f"{mine.sent[busiest]} B = {ratio:.2f}x the "
                               f"bytes of {formula} = {optimum_bytes:.0f} B (n={case.n}, M={case.nbytes} B)")
        t_mine, t_ref = max(mine.clocks), max(ref.clocks)
        self.report.add("cost: modelled time against virtualpar's reference", t_mine <= time_slack * t_ref,
                        output=f"modelled time {t_mine * 1e6:.1f} µs against the "
                               f"reference's {t_ref * 1e6:.1f} µs "
                               f"({t_mine / t_ref:.2f}x) on h100-node")


def _summary(problems: list[str]) -> str:
    """The first problem in full; the others one line each."""
    if not problems:
        return ""
    more = [p.splitlines()[0] for p in problems[1:4]]
    rest = len(problems) - 1 - len(more)
    return "\n".join([problems[0], *(f"also: {m}" for m in more),
                      *([f"and {rest} more"] if rest > 0 else [])])
