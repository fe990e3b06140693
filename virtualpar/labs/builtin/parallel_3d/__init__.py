"""Lab 9: a 3D-parallel transformer step — choose dp × tp × pp's settings, then train it exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .... import VirtualCluster, nn
from ....errors import VirtualParError
from ....parallel import ParallelConfig, ParallelTrainer
from ....parallel.plan import estimate, plan
from ....sim.hardware import get_hardware
from ...harness import describe
from ...lab import CheckOptions, Lab
from ...report import Report
from ...student import load_student

FUNCTIONS = ("configure", "bubble")
HARDWARE, BATCH, LR = "h100-node", 32, 1e-2


def _planning_model() -> nn.GPT:
    return nn.GPT.preset("small")


def _best_3d(model: nn.GPT, capacity: float):
    fit, _ = plan(model, 8, HARDWARE, batch=BATCH, capacity=capacity)
    return [e for e in fit if (e.config.dp, e.config.tp, e.config.pp, e.config.cp) == (2, 2, 2, 1)]


def _budgets(model: nn.GPT) -> list[tuple[str, float]]:
    everything = _best_3d(model, float("inf"))
    mems = sorted(e.memory["total"] for e in everything)
    return [("generous memory (the H100's)", get_hardware(HARDWARE).device.memory_capacity),
            ("tight memory", float(mems[len(mems) // 4]))]


def _trains_exactly(cfg: ParallelConfig, path: str) -> list[str]:
    """Two float64 AdamW steps of a small GPT under ``cfg`` on 8 devices against one process."""
    batch = 2 * cfg.dp * cfg.microbatches
    rng = np.random.default_rng(0)
    tokens, targets = rng.integers(0, 32, (batch, 8)), rng.integers(0, 32, (batch, 8))

    def gpt() -> nn.GPT:
        return nn.GPT(32, 16, 4, 4, 8, seed=3, dtype=np.float64)

    want_losses, want = nn.reference_train(gpt(), [(tokens, targets)], nn.cross_entropy, nn.AdamW(LR), 2)
    trainer = ParallelTrainer(gpt(), cfg, optimizer=nn.AdamW(LR))
    try:
        with VirtualCluster(cfg.mesh(), timeout=30, run_timeout=120) as cluster:
            losses = [cluster.execute(trainer, tokens, targets) for _ in range(2)]
            got = trainer.state_dict(cluster)
    except (VirtualParError, ValueError) as exc:
        return [f"{cfg}: {describe(exc, path)}"]
    worst = max(float(np.max(np.abs(got[k] - want[k]))) for k in want)
    if worst > 1e-9 or not np.allclose(losses, want_losses, rtol=0, atol=1e-9):
        return [f"{cfg}: the weights differ from one process's by up to {worst:.3g}"]
    return []


def check(path: str, options: CheckOptions) -> Report:
    module = load_student(path, FUNCTIONS)
    report = Report(LAB.name)
    model = _planning_model()
    problems: dict[str, list[str]] = {"3d": [], "fits": [], "fast": []}
    chosen = None
    for what, capacity in _budgets(model):  # the planner is pure and quick: both budgets always
        try:
            cfg = module.configure(model, BATCH, capacity)
            if not isinstance(cfg, ParallelConfig):
                raise TypeError(f"configure returned {type(cfg).__name__}, not a ParallelConfig")
            cfg.check_model(model)
            cfg.check_batch((BATCH, model.seq_len), model.seq_len)
        except Exception as exc:  # the student's error, named
            problems["3d"].append(f"{what}: {type(exc).__name__}: {exc}")
            continue
        if (cfg.dp, cfg.tp, cfg.pp, cfg.cp) != (2, 2, 2, 1):
            problems["3d"].append(f"{what}: dp={cfg.dp} tp={cfg.tp} pp={cfg.pp} cp={cfg.cp}; this lab asks "
                                  f"for dp = tp = pp = 2 on its 8 devices")
            continue
        chosen = chosen or cfg
        mine = estimate(model, cfg, BATCH, model.seq_len, get_hardware(HARDWARE))
        if mine.memory["total"] > capacity:
            problems["fits"].append(f"{what}: your configuration needs "
                                    f"{mine.memory['total'] / 2**20:.1f} MiB "
                                    f"per device, the budget is {capacity / 2**20:.1f} MiB "
                                    f"({', '.join(f'{k} {v / 2**20:.1f}' for k, v in mine.memory.items())})")
            continue
        best = _best_3d(model, capacity)[0]
        if mine.step_time > 1.1 * best.step_time:
            problems["fast"].append(
                f"{what}: {mine.label()} takes {mine.step_time * 1e3:.3f} ms modelled "
                f"(bubble {mine.bubble:.1%}, "
                f"exposed communication {mine.exposed_comm * 1e3:.3f} ms); {best.label()} takes "
                f"{best.step_time * 1e3:.3f} ms (bubble {best.bubble:.1%})")
    report.add("configure: dp = tp = pp = 2, valid for the model and batch", not problems["3d"],
               output="\n".join(problems["3d"][:2]))
    report.add("configure: fits the memory budget", not problems["3d"] and not problems["fits"],
               output="\n".join(problems["fits"][:2]) or ("not judged" if problems["3d"] else ""))
    report.add("configure: within 10% of the best modelled step", not problems["3d"] and not problems["fits"]
               and not problems["fast"], output="\n".join(problems["fast"][:2]))
    exact = _trains_exactly(chosen, path) if chosen is not None else ["not judged: no valid configuration"]
    report.add("your configuration trains exactly as one process does", not exact, output="\n".join(exact))
    wrong = []
    for schedule, pp, m, v in (("gpipe", 4, 8, 2), ("1f1b", 2, 1, 2), ("interleaved_1f1b", 4, 8, 2),
                               ("interleaved_1f1b", 2, 4, 3)):
        want = (pp - 1) / ((v if schedule == "interleaved_1f1b" else 1) * m + pp - 1)
        try:
            got = float(module.bubble(schedule, pp, m, virtual=v))
        except Exception as exc:
            wrong.append(f"bubble({schedule!r}, {pp}, {m}, virtual={v}) raised {type(exc).__name__}: {exc}")
            continue
        if abs(got - want) > 1e-12:
            wrong.append(f"bubble({schedule!r}, {pp}, {m}, virtual={v}) = {got:.6g}, expected {want:.6g}")
    report.add("bubble: the closed forms", not wrong, output="\n".join(wrong[:3]))
    return report


LAB = Lab(
    name="parallel-3d",
    goal="Configure and run a 3D-parallel (dp x tp x pp) transformer step that fits and is fast",
    concept="composing DP, TP and PP: memory, bubbles and communication traded against each other",
    difficulty="advanced",
    folder=Path(__file__).parent,
    functions=FUNCTIONS,
    check_fn=check,
)
