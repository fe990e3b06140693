"""Lab 6: ZeRO-1 — reduce-scatter, a sharded Adam, all-gather."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from ....mesh import Mesh
from ...harness import compare, describe, run_student, side_by_side
from ...lab import CheckOptions, Lab
from ...report import Report
from ...student import COLLECTIVES, StudentFunction, broke_rule, load_student

FUNCTION = "zero1_step"
RULE = "ZeRO-1 in this lab uses only dev.reduce_scatter and dev.all_gather"
FORBIDDEN = tuple(c for c in COLLECTIVES if c not in ("reduce_scatter", "all_gather")) + (
    "send", "recv", "isend", "irecv", "sendrecv", "ssend", "issend")
P, STEPS, LR, BETAS, EPS = 12, 5, 1e-2, (0.9, 0.999), 1e-8


def _numbers(value: Any) -> int:
    """How many numbers a state holds (arrays and scalars, through dicts, lists and tuples)."""
    if isinstance(value, dict):
        return sum(_numbers(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_numbers(v) for v in value)
    return int(np.size(value)) if isinstance(value, np.ndarray) else 0


def _train(dev: Any, params: np.ndarray, grads: np.ndarray, *, step: Any) -> tuple[np.ndarray, int]:
    state: dict = {}
    for g in grads:
        params = step(dev, params, g, state, lr=LR, betas=BETAS, eps=EPS)
    return params, _numbers(state)


def _adam(params: np.ndarray, grads: np.ndarray) -> np.ndarray:
    """Single-process Adam on the mean gradient: grads has shape (devices, steps, P)."""
    m = v = np.zeros_like(params)
    for t, g in enumerate(grads.mean(axis=0), start=1):
        m = BETAS[0] * m + (1 - BETAS[0]) * g
        v = BETAS[1] * v + (1 - BETAS[1]) * g * g
        params = params - LR * (m / (1 - BETAS[0] ** t)) / (np.sqrt(v / (1 - BETAS[1] ** t)) + EPS)
    return params


def check(path: str, options: CheckOptions) -> Report:
    load_student(path, [FUNCTION])
    report = Report(LAB.name)
    fn = functools.partial(_train, step=StudentFunction(path, FUNCTION))
    problems: dict[str, list[str]] = {"correct": [], "memory": [], "comm": [], "rules": []}
    for n in ((2, 4) if options.quick else (1, 2, 3, 4)):
        rng = np.random.default_rng(n)
        params, grads = rng.standard_normal(P), rng.standard_normal((n, STEPS, P))
        mesh = Mesh({"dp": n})
        run = run_student(fn, [(params, grads[r]) for r in range(n)], mesh, forbidden=FORBIDDEN, rule=RULE)
        if not run.ok:
            key = "rules" if broke_rule(run.error) else "correct"
            problems[key].append(f"{n} device(s): {describe(run.error, path)}")
            continue
        want = _adam(params, grads)
        problems["correct"] += [f"{n} device(s), after {STEPS} steps: {p}" for p in
                                compare([r[0] for r in run.results], [want] * n, mesh, rtol=1e-12, atol=1e-12,
                                        what="params")]
        for rank, (_, held) in enumerate(run.results):
            if held > 2 * P // n + 2:
                problems["memory"].append(f"{n} device(s): device {rank} keeps {held} "
                                          "numbers of optimizer state; "
                                          f"ZeRO-1 keeps m and v for its shard only, 2P/n = {2 * P // n}")
                break
        for rank, calls in enumerate(run.calls or []):
            names = [name for name, _ in calls]
            if names != ["reduce_scatter", "all_gather"] * STEPS:
                problems["comm"].append(f"{n} device(s): device {rank} called "
                                        f"{names[:4]}{'...' if len(names) > 4 else ''}"
                                        f" over {STEPS} steps; expected one reduce_scatter "
                                        "and one all_gather a step")
                break
    report.add("params match Adam on the mean gradient", not problems["correct"],
               output="\n".join(problems["correct"][:3]))
    judged = "" if not problems["correct"] else "not judged until the parameters are right"
    report.add("memory: optimizer state for one shard only",
               not problems["correct"] and not problems["memory"],
               output=judged or "\n".join(problems["memory"][:2]))
    report.add("communication: one reduce-scatter and one all-gather per step",
               not problems["correct"] and not problems["comm"],
               output=judged or "\n".join(problems["comm"][:2]))
    report.add("rules: only reduce_scatter and all_gather", not problems["rules"],
               output="\n".join(problems["rules"][:1]))
    rng = np.random.default_rng(4)
    params, grads = rng.standard_normal(P), rng.standard_normal((4, STEPS, P))
    reference = functools.partial(_train, step=StudentFunction(LAB.reference, FUNCTION))
    per_rank = [(params, grads[r]) for r in range(4)]
    runs = [(label, run_student(f, per_rank, Mesh({"dp": 4}), forbidden=FORBIDDEN, rule=RULE, trace=True))
            for label, f in (("your run", fn), ("the reference", reference))]
    side_by_side(report, runs, f"{STEPS} steps on 4 devices", options.width, options.png)
    return report


LAB = Lab(
    name="zero1",
    goal="Write ZeRO-1 data parallelism: reduce-scatter, a sharded Adam, all-gather",
    concept="ZeRO: optimizer state sharded over data parallelism at the bytes of an all-reduce",
    difficulty="intermediate",
    folder=Path(__file__).parent,
    functions=(FUNCTION,),
    check_fn=check,
)
