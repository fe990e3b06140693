"""Lab 8: a pipelined MLP with a data-parallel axis, written by hand with p2p and all_reduce."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ....mesh import Mesh
from ...harness import compare, describe, run_student, side_by_side
from ...lab import CheckOptions, Lab
from ...report import Report
from ...student import COLLECTIVES, StudentFunction, broke_rule, load_student

FUNCTION = "pipeline_dp_step"
RULE = "this lab allows p2p between the stages and dev.all_reduce over 'dp'"
FORBIDDEN = tuple(c for c in COLLECTIVES if c != "all_reduce")
B, D, H, O = 4, 3, 5, 2


def _case(microbatches: int, seed: int = 0):
    rng = np.random.default_rng(seed + microbatches)
    mesh = Mesh({"dp": 2, "pp": 2})
    w0, w1 = rng.standard_normal((D, H)), rng.standard_normal((H, O))
    xs, ys = rng.standard_normal((2, B, D)), rng.standard_normal((2, B, O))
    x, y = xs.reshape(-1, D), ys.reshape(-1, O)  # the whole batch, for the reference
    h = np.tanh(x @ w0)
    dout = (h @ w1 - y) / (2 * B)
    dw1 = h.T @ dout
    dw0 = x.T @ ((dout @ w1.T) * (1 - h ** 2))
    args, want = [], []
    for rank in range(mesh.size):
        i = mesh.index(rank)
        args.append((xs[i.dp], ys[i.dp], (w0, w1)[i.pp], microbatches, 2 * B))
        want.append((dw0, dw1)[i.pp])
    return mesh, args, want


def check(path: str, options: CheckOptions) -> Report:
    load_student(path, [FUNCTION])
    report = Report(LAB.name)
    fn = StudentFunction(path, FUNCTION)
    problems: dict[str, list[str]] = {"correct": [], "strict": [], "bytes": [], "rules": []}
    for microbatches in ((2,) if options.quick else (1, 2, 4)):
        for mode in ("plain", "strict (eager_limit=0)"):
            mesh, args, want = _case(microbatches)
            run = run_student(fn, args, mesh, mode=mode, forbidden=FORBIDDEN, rule=RULE)
            where = f"{microbatches} microbatch(es), {mode}"
            key = "correct" if mode == "plain" else "strict"
            if not run.ok:
                ruled = broke_rule(run.error)
                problems["rules" if ruled else key].append(f"{where}: {describe(run.error, path)}")
                continue
            found = compare(run.results, want, mesh, rtol=1e-10, what="gradient")
            problems[key] += [f"{where}: {p}" for p in found]
            if mode == "plain":  # between a pipeline's two stages only activations and their gradients travel
                expected = B * H * 8
                for rank in range(mesh.size):
                    first, last = mesh.group_of(rank, "pp")
                    if rank != first:
                        continue
                    sent = (int(run.bytes[first, last]), int(run.bytes[last, first]))
                    if sent != (expected, expected):
                        problems["bytes"].append(
                            f"{where}: stage 0 (device {first}) sent {sent[0]} B to "
                            f"stage 1 and got {sent[1]} B "
                            f"back; the activations h and their gradients are B*H*8 = {expected} B each way")
                        break
    report.add("gradients match numpy over the whole batch", not problems["correct"],
               output="\n".join(problems["correct"][:3]))
    report.add("safe in strict mode (eager_limit=0)", not problems["correct"] and not problems["strict"],
               output="\n".join(problems["strict"][:2]) or ("not judged" if problems["correct"] else ""))
    report.add("communication: activations between stages, gradients over dp",
               not problems["correct"] and not problems["bytes"],
               output="\n".join(problems["bytes"][:2]) or ("not judged" if problems["correct"] else ""))
    report.add("rules: p2p and all_reduce only", not problems["rules"],
               output="\n".join(problems["rules"][:1]))
    mesh, args, _ = _case(2)
    runs = [(label, run_student(f, args, mesh, forbidden=FORBIDDEN, rule=RULE, trace=True))
            for label, f in (("your run", fn), ("the reference", StudentFunction(LAB.reference, FUNCTION)))]
    side_by_side(report, runs, "2 microbatches on dp=2 x pp=2", options.width, options.png)
    return report


LAB = Lab(
    name="pipeline-dp",
    goal="Write one training step of a 2-stage pipeline with a data-parallel axis",
    concept="composing parallelisms along mesh axes: activations along pp, gradients along dp",
    difficulty="advanced",
    folder=Path(__file__).parent,
    functions=(FUNCTION,),
    check_fn=check,
)
