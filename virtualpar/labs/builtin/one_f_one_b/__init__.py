"""Lab 5: the 1F1B schedule as a list of actions, graded by the validator and the simulator."""

from __future__ import annotations

from pathlib import Path

import os

from ....pipeline import Diagram, Placement, ScheduleError, format_grid, simulate, validate
from ...lab import CheckOptions, Lab
from ...report import Report
from ...student import load_student

FUNCTION = "one_f_one_b"


def _grid(quick: bool) -> list[tuple[int, int]]:
    full = [(1, 1), (1, 3), (2, 1), (2, 4), (3, 2), (4, 4), (4, 8), (5, 3), (3, 7)]
    return [(2, 4), (4, 8), (5, 3)] if quick else full


def _placement(ranks: int) -> Placement:
    return Placement(ranks=ranks, stage_rank=tuple(range(ranks)))


def check(path: str, options: CheckOptions) -> Report:
    fn = getattr(load_student(path, [FUNCTION]), FUNCTION)
    report = Report(LAB.name)
    valid, timed = [], {}
    problems: dict[str, list[str]] = {"valid": [], "makespan": [], "bubble": [], "memory": []}
    for R, M in _grid(options.quick):
        where = f"ranks={R}, microbatches={M}"
        try:
            schedule = fn(R, M)
            validate(schedule, _placement(R), M)
        except ScheduleError as exc:
            problems["valid"].append(f"{where}: {exc}")
            continue
        except Exception as exc:  # the student's own error
            problems["valid"].append(f"{where}: one_f_one_b raised {type(exc).__name__}: {exc}")
            continue
        valid.append((R, M))
        unit = simulate(schedule, _placement(R), M, costs={"F": 1.0, "B": 1.0})
        skewed = simulate(schedule, _placement(R), M, costs={"F": 1.0, "B": 2.0})
        timed[(R, M)] = (schedule, unit)
        for sim, f, b in ((unit, 1, 1), (skewed, 1, 2)):
            want = (M + R - 1) * (f + b)
            if abs(sim.makespan - want) > 1e-9:
                problems["makespan"].append(f"{where}, F={f}, B={b}: makespan {sim.makespan:g}, expected "
                                            f"(M + R - 1)(F + B) = {want}")
        if abs(unit.bubble - (R - 1) / (M + R - 1)) > 1e-9:
            problems["bubble"].append(f"{where}: bubble {unit.bubble:.4f}, expected (R-1)/(M+R-1) = "
                                      f"{(R - 1) / (M + R - 1):.4f}")
        for s, peak in enumerate(unit.peak_activations):
            if peak != min(R - s, M):
                problems["memory"].append(f"{where}: stage {s} holds {peak} microbatches' activations at its "
                                          f"peak; 1F1B holds min(R - s, M) = {min(R - s, M)}")
                break
    report.add("valid: every F and B once, in an order that can run", not problems["valid"],
               output="\n".join(problems["valid"][:2]))
    judged = "" if valid else "not judged: no valid schedule"
    report.add("makespan: (M + R - 1)(F + B)", bool(valid) and not problems["makespan"],
               output=judged or "\n".join(problems["makespan"][:4]))
    report.add("bubble: (R - 1)/(M + R - 1)", bool(valid) and not problems["bubble"],
               output=judged or "\n".join(problems["bubble"][:4]))
    report.add("memory: stage s holds at most min(R - s, M) microbatches",
               bool(valid) and not problems["memory"], output=judged or "\n".join(problems["memory"][:4]))
    if (4, 8) in timed:
        ref = load_student(LAB.reference, [FUNCTION]).one_f_one_b(4, 8)
        ref_sim = simulate(ref, _placement(4), 8, costs={"F": 1.0, "B": 1.0})
        schedule, sim = timed[(4, 8)]
        report.timeline = (f"your schedule, R=4, M=8, F=B=1 (makespan {sim.makespan:g}, "
                           f"bubble {sim.bubble:.3f}):\n"
                           f"{format_grid(sim.grid(), line_width=options.width)}\n\nthe reference (makespan "
                           f"{ref_sim.makespan:g}, bubble {ref_sim.bubble:.3f}):\n"
                           f"{format_grid(ref_sim.grid(), line_width=options.width)}")
        if options.png:
            for label, run in (("run", sim), ("reference", ref_sim)):
                path = os.path.join(options.png, f"{LAB.name}-{label}.png")
                title = "your 1F1B" if label == "run" else "the reference 1F1B"
                Diagram.from_simulation(run, _placement(4), title=f"{title}, R=4, M=8").to_png(path)
                report.pictures.append(path)
    return report


LAB = Lab(
    name="one-f-one-b",
    goal="Write the 1F1B pipeline schedule as lists of actions",
    concept="pipeline bubbles (R-1)/(M+R-1) and the activation memory 1F1B saves over GPipe",
    difficulty="intermediate",
    folder=Path(__file__).parent,
    functions=(FUNCTION,),
    check_fn=check,
)
