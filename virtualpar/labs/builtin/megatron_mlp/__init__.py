"""Lab 3: Megatron's column-then-row MLP with f and g, forward and backward."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ....mesh import Mesh
from ...harness import compare, describe, run_student, side_by_side
from ...lab import CheckOptions, Lab
from ...report import Report
from ...student import COLLECTIVES, StudentFunction, broke_rule, load_student

FUNCTIONS = ("mlp_forward", "mlp_backward")
RULE = "the only communication in this lab is dev.all_reduce(..., group='tp')"
FORBIDDEN = tuple(c for c in COLLECTIVES if c != "all_reduce") + ("send", "recv", "isend", "irecv",
                                                                  "sendrecv", "ssend", "issend")
B, D, H = 3, 4, 8


def _meshes(quick: bool) -> list[dict[str, int]]:
    return [{"tp": 2}, {"dp": 2, "tp": 2}] if quick else [{"tp": 1}, {"tp": 2}, {"tp": 4}, {"dp": 2, "tp": 2}]


def _data(mesh: Mesh, seed: int = 0):
    """Per dp group its own x and dy; one W1, W2; the reference values per device."""
    rng = np.random.default_rng(seed)
    w1, w2 = rng.standard_normal((D, H)), rng.standard_normal((H, D))
    t = mesh.shape.get("tp", 1)
    groups = mesh.shape.get("dp", 1)
    xs, dys = rng.standard_normal((groups, B, D)), rng.standard_normal((groups, B, D))
    fwd_args, bwd_args, ys, grads = [], [], [], []
    for rank in range(mesh.size):
        index = mesh.index(rank)
        g, i = getattr(index, "dp", 0) if "dp" in mesh.shape else 0, index.tp
        cols = slice(i * H // t, (i + 1) * H // t)
        x, dy = xs[g], dys[g]
        fwd_args.append((x, w1[:, cols].copy(), w2[cols].copy()))
        bwd_args.append((x, w1[:, cols].copy(), w2[cols].copy(), dy))
        a = x @ w1
        z = np.maximum(a, 0)
        ys.append(z @ w2)
        da = (dy @ w2.T) * (a > 0)
        grads.append((da @ w1.T, (x.T @ da)[:, cols], (z.T @ dy)[cols]))
    return fwd_args, bwd_args, ys, grads


def _calls_problem(run, mesh: Mesh, what: str) -> str | None:
    for rank, calls in enumerate(run.calls or []):
        reduces = [shape for name, shape in calls if name == "all_reduce"]
        if reduces != [(B, D)]:
            return (f"device {rank} {mesh.index(rank)} made {len(reduces)} "
                    f"all-reduce(s) of shapes {reduces} in "
                    f"the {what}; Megatron needs exactly one, of the (batch, d) = {(B, D)} output")
    return None


def check(path: str, options: CheckOptions) -> Report:
    load_student(path, FUNCTIONS)
    report = Report(LAB.name)
    fwd, bwd = StudentFunction(path, FUNCTIONS[0]), StudentFunction(path, FUNCTIONS[1])
    problems = {"forward": [], "backward": [], "forward cost": [], "backward cost": [], "rules": []}
    for shape in _meshes(options.quick):
        mesh = Mesh(shape)
        fwd_args, bwd_args, ys, grads = _data(mesh, seed=len(shape) + mesh.size)
        for what, fn, args in (("forward", fwd, fwd_args), ("backward", bwd, bwd_args)):
            run = run_student(fn, args, mesh, forbidden=FORBIDDEN, rule=RULE)
            where = f"mesh {dict(shape)}"
            if not run.ok:
                key = "rules" if broke_rule(run.error) else what
                problems[key].append(f"{where}: {describe(run.error, path)}")
                continue
            if what == "forward":
                found = compare(run.results, ys, mesh, rtol=1e-10, what="y")
            else:
                found = []
                for k, name in enumerate(("dx", "dw1", "dw2")):
                    got = [r[k] if isinstance(r, tuple) and len(r) == 3 else r for r in run.results]
                    found += compare(got, [g[k] for g in grads], mesh, rtol=1e-10, what=name)
            problems[what] += [f"{where}: {p}" for p in found]
            if (cost := _calls_problem(run, mesh, what)) is not None:
                problems[f"{what} cost"].append(f"{where}: {cost}")
    hint = ("\nhint: reduce over group='tp' only — on a dp x tp mesh, group=None sums the data-parallel "
            "replicas too")
    for key, name in (("forward", "forward matches numpy"),
                      ("backward", "backward (dx, dw1, dw2) matches numpy"),
                      ("forward cost", "forward: exactly one all-reduce of (batch, d)"),
                      ("backward cost", "backward: exactly one all-reduce of (batch, d)")):
        found = problems[key]
        extra = hint if found and any("'dp'" in p or "dp=" in p for p in found) and "cost" not in key else ""
        report.add(name, not found, output="\n".join(found[:3]) + extra)
    report.add("rules: only all_reduce over tp", not problems["rules"],
               output="\n".join(problems["rules"][:1]))
    mesh = Mesh({"dp": 2, "tp": 2})
    args = _data(mesh, seed=1)[1]
    reference = StudentFunction(LAB.reference, FUNCTIONS[1])
    runs = [(label, run_student(fn, args, mesh, forbidden=FORBIDDEN, rule=RULE, trace=True))
            for label, fn in (("your run", bwd), ("the reference", reference))]
    side_by_side(report, runs, "the backward on dp=2 x tp=2", options.width, options.png)
    return report


LAB = Lab(
    name="megatron-mlp",
    goal="Write Megatron's column-then-row tensor-parallel MLP, forward and backward",
    concept="tensor parallelism: f and g, one all-reduce per pass",
    difficulty="intermediate",
    folder=Path(__file__).parent,
    functions=FUNCTIONS,
    check_fn=check,
)
