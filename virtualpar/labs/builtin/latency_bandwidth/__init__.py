"""Lab 2: latency against bandwidth — a recursive-doubling all-reduce and the α–β crossover."""

from __future__ import annotations

import math
from pathlib import Path

from ...harness import describe
from ...lab import CheckOptions, Lab
from ...report import Report
from ...student import StudentFunction, load_student
from ..allreduce_grader import Case, Grader

FUNCTIONS = ("tree_all_reduce", "crossover_bytes")
RING = Path(__file__).parent.parent / "ring_allreduce" / "reference.py"


def _groups(quick: bool) -> list[tuple[str, list[Case]]]:
    return [
        ("correct on 1, 2, 4 and 8 devices",
         [Case(n, (6,), "float64") for n in ((1, 4) if quick else (1, 2, 4, 8))]),
        ("correct on 3, 5 and 6 devices (folding the extra ones)",
         [Case(n, (5,), "float64") for n in ((3, 6) if quick else (3, 5, 6))]),
        ("correct for float32, int64, 2-d and non-contiguous inputs",
         [Case(4, (7,), "float32"), Case(3, (9,), "int64"), Case(5, (2, 3), "float64", strided=True)]),
    ]


def _crossover_cases() -> list[tuple[int, float, float]]:
    return [(4, 2e-6, 1e-10), (8, 5e-6, 4e-11), (16, 1e-6, 1e-9), (64, 3e-6, 2e-11), (2, 1e-6, 1e-10)]


def _expected_crossover(n: int, alpha: float, beta: float) -> float:
    steps = math.log2(n)
    slope = steps - 2 * (n - 1) / n
    return math.inf if slope <= 0 else alpha * (2 * (n - 1) - steps) / (beta * slope)


def check(path: str, options: CheckOptions) -> Report:
    module = load_student(path, FUNCTIONS)
    report = Report(LAB.name)
    grader = Grader(report, StudentFunction(path, FUNCTIONS[0]), StudentFunction(LAB.reference, FUNCTIONS[0]),
                    options)
    grader.correctness(_groups(options.quick))
    grader.safety(Case(6, (8,), "float64", seed=5))
    n = 8
    mine, ring = grader.run(grader.student, Case(n, (8,), "float64", seed=2))[0], \
        grader.run(StudentFunction(RING, "ring_all_reduce"), Case(n, (8,), "float64", seed=2))[0]
    limit = 2 * math.ceil(math.log2(n))
    if mine.ok:
        busiest = max(range(n), key=lambda r: mine.messages[r])
        report.add("latency: messages sent by the busiest device", mine.messages[busiest] <= limit,
                   output=f"device {busiest} sent {mine.messages[busiest]} messages; a tree needs at most "
                          f"2*ceil(log2 n) = {limit} at n={n} (a ring sends 2(n-1) = {2 * (n - 1)})")
        t_tree, t_ring = max(mine.clocks), max(ring.clocks)
        report.add("latency: beats the ring on a 64-byte message (modelled clock)", t_tree < t_ring,
                   output=f"your all-reduce took {t_tree * 1e6:.2f} µs, virtualpar's "
                          f"ring {t_ring * 1e6:.2f} µs "
                          f"on h100-node, n={n}")
    else:
        for name in ("latency: messages sent by the busiest device",
                     "latency: beats the ring on a 64-byte message (modelled clock)"):
            report.add(name, False, output=f"not judged: the run failed: {describe(mine.error, path)}")
    wrong = []
    for n, alpha, beta in _crossover_cases():
        want = _expected_crossover(n, alpha, beta)
        try:
            got = float(module.crossover_bytes(n, alpha, beta))
        except Exception as exc:  # the student's bug, named
            wrong.append(f"crossover_bytes({n}, {alpha}, {beta}) raised {type(exc).__name__}: {exc}")
            continue
        if not (got == want or math.isclose(got, want, rel_tol=1e-6)):
            wrong.append(f"crossover_bytes({n}, {alpha}, {beta}) = {got!r}, expected {want!r} bytes")
    report.add("crossover: the alpha-beta closed form", not wrong, output="\n".join(wrong))
    if options.png or not options.quick:
        grader.timelines(Case(8, (8,), "float64", seed=4))
    return report


LAB = Lab(
    name="latency-bandwidth",
    goal="Write a recursive-doubling all-reduce and find where the ring overtakes it",
    concept="the alpha-beta model: log2(n) latency steps against 2(n-1)/n*M bytes",
    difficulty="intro",
    folder=Path(__file__).parent,
    functions=FUNCTIONS,
    check_fn=check,
)
