"""Lab 1: a ring all-reduce from send/recv (reduce-scatter, then all-gather)."""

from __future__ import annotations

from pathlib import Path

from ...lab import CheckOptions, Lab
from ...report import Report
from ...student import StudentFunction, load_student
from ..allreduce_grader import Case, Grader

FUNCTION = "ring_all_reduce"


def _groups(quick: bool) -> list[tuple[str, list[Case]]]:
    return [
        ("correct on one device", [Case(1, (5,), "float64")]),
        ("correct when the size divides",
         [Case(n, (12,), "float64") for n in ((2, 4) if quick else (2, 3, 4))]),
        ("correct when it does not divide, and with fewer elements than devices",
         [Case(3, (7,), "float64"), Case(4, (2,), "float64"), Case(5, (3, 5), "float64", seed=3)]),
        ("correct for float32 and int64, and for non-contiguous inputs",
         [Case(3, (10,), "float32"), Case(4, (9,), "int64"), Case(3, (4, 6), "float64", strided=True)]),
    ]


def check(path: str, options: CheckOptions) -> Report:
    load_student(path, [FUNCTION])  # a missing function or an import error stops here, named
    report = Report(LAB.name)
    grader = Grader(report, StudentFunction(path, FUNCTION), StudentFunction(LAB.reference, FUNCTION),
                    options)
    grader.correctness(_groups(options.quick))
    grader.safety(Case(4, (12,), "float64", seed=5))
    n = 4
    case = Case(n, (n * 1024,), "float64", seed=9)
    grader.cost(case, 2 * (n - 1) / n * case.nbytes, "a ring's 2(n-1)/n*M")
    return report


LAB = Lab(
    name="ring-allreduce",
    goal="Write a ring all-reduce from send/recv: reduce-scatter, then all-gather",
    concept="bandwidth-optimal collectives: 2(n-1)/n*M bytes per device",
    difficulty="intro",
    folder=Path(__file__).parent,
    functions=(FUNCTION,),
    check_fn=check,
)
