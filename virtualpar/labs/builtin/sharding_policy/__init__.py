"""Lab 4: choosing a sharding policy, checked against the policy explorer."""

from __future__ import annotations

from pathlib import Path

from ....mesh import Mesh
from ....tensor_parallel import explore
from ...lab import CheckOptions, Lab
from ...report import Report
from ...student import load_student

FUNCTIONS = ("forward_bytes", "best_layouts")
ITEMSIZE = 4


def _shapes(quick: bool) -> list[tuple[int, int, int, int]]:
    full = [(64, 4096, 64, 4), (4096, 64, 4096, 4), (512, 512, 512, 2), (256, 64, 1024, 8),
            (2048, 512, 128, 4), (128, 1024, 4096, 2)]
    return full[:3] if quick else full


def _candidates(m: int, k: int, n: int, t: int):
    """(a_spec, b_spec, bytes, flops) of each assignment, from the explorer (C replicated)."""
    out = []
    for c in explore(m, k, n, Mesh({"tp": t}), "h100-node", "float32", replicate_output=True):
        a, b = c.layer.name.removeprefix("A").split("·B")  # "A[R, S(tp)]·B[S(tp), R]"
        out.append((a, b, sum(x.bytes_sent for x in c.cost.forward.collectives), c.cost.forward.flops))
    return out


def check(path: str, options: CheckOptions) -> Report:
    module = load_student(path, FUNCTIONS)
    report = Report(LAB.name)
    wrong_bytes, wrong_choice = [], []
    for m, k, n, t in _shapes(options.quick):
        cands = _candidates(m, k, n, t)
        for a, b, want, _ in cands:
            try:
                got = float(module.forward_bytes(a, b, m, k, n, t, ITEMSIZE))
            except Exception as exc:  # the student's bug, named
                wrong_bytes.append(f"forward_bytes({a!r}, {b!r}, {m}, {k}, {n}, t={t}) raised "
                                   f"{type(exc).__name__}: {exc}")
                continue
            if abs(got - want) > 1e-6 * max(1.0, want):
                wrong_bytes.append(f"forward_bytes({a!r}, {b!r}, m={m}, k={k}, n={n}, t={t}) = {got:g}, the "
                                   f"explorer says {want} B")
        least = min(f for *_, f in cands)
        split = [(a, b, cost) for a, b, cost, f in cands if f == least]
        best = min(cost for *_, cost in split)
        try:
            choice = tuple(str(x) for x in module.best_layouts(m, k, n, t))
        except Exception as exc:
            wrong_choice.append(f"best_layouts({m}, {k}, {n}, {t}) raised {type(exc).__name__}: {exc}")
            continue
        norm = {(a.replace(" ", ""), b.replace(" ", "")): cost for a, b, cost in split}
        key = tuple(x.replace(" ", "") for x in choice)
        if norm.get(key) != best:
            winners = [f"A{a}·B{b}" for a, b, cost in split if cost == best]
            why = ("it does not split the work" if key not in norm else f"it sends {norm[key]} B")
            wrong_choice.append(f"m={m}, k={k}, n={n}, t={t}: you chose "
                                f"A{choice[0]}·B{choice[1]}, but {why}; "
                                f"the fewest bytes ({best} B) are sent by {', '.join(winners)}")
    report.add("forward_bytes matches the explorer for every layout", not wrong_bytes,
               output="\n".join(wrong_bytes[:4]))
    report.add("best_layouts picks the cheapest split", not wrong_choice, output="\n".join(wrong_choice[:3]))
    return report


LAB = Lab(
    name="sharding-policy",
    goal="Work out the bytes each sharding of a matmul moves, and pick the cheapest",
    concept="sharding policies: which layouts gather, which all-reduce, and why one moves 2x another",
    difficulty="intermediate",
    folder=Path(__file__).parent,
    functions=FUNCTIONS,
    check_fn=check,
)
