"""A pipelined MLP trained on a real cluster, for ``virtualpar pipeline`` and the tour.

Presentation: it starts a cluster and writes text, so it lives with the commands."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from .. import nn
from .._words import counted
from ..errors import UsageError
from ..pipeline.executor import PipelinedOperation
from ..pipeline.partition import Pipeline
from ..pipeline.schedules import build, default_virtual, used_kinds
from ..runtime import VirtualCluster
from ..sim import Hardware
from ..trace.fmt import WIDTH, number, seconds

__all__ = ["train_demo", "run_demo", "plan_demo", "report", "DemoRun", "tour_section", "seed_mlp"]

SIZES = (256, 512, 1024, 512, 256)


def seed_mlp(dtype=np.float32, sizes=SIZES) -> nn.Sequential:
    """Seed 003's MLP: dense layers 256→512→1024→512→256 with ReLU between them."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b, seed=i, dtype=dtype))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


@dataclass(frozen=True)
class DemoRun:
    """What :func:`run_demo` returns: the schedule's shape, the losses, the modelled clock after
    the steps (seconds, or cost units under ``costs``), the operation (its ``timeline()``), and the
    comparison with single-process training (None when not checked)."""

    schedule: str
    devices: int
    virtual: int
    stages: int
    microbatches: int
    batch: int
    losses: list[float]
    clock: float
    costs: dict[str, float] | None
    hardware: str | None
    op: Any
    matches: bool | None


def plan_demo(schedule: str, devices: int | None, microbatches: int, batch: int,
              virtual: int | None) -> tuple[int, int]:
    """Check the demo's sizes before any device starts; return ``(devices, virtual)``.  Every
    refusal is a ``UsageError`` naming the number it wants."""
    virtual = default_virtual(schedule) if virtual is None else virtual
    for name, value in (("devices", devices), ("virtual", virtual)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UsageError(f"{name} must be a positive int, got {value!r}")
    if devices is None:
        devices = max(1, 4 // virtual)
    stages = devices * virtual
    layers = 2 * (len(SIZES) - 1) - 1  # Linear, ReLU, ..., Linear
    if not 1 <= stages <= layers:
        raise UsageError(f"{schedule} on {devices} devices with {counted(virtual, 'model chunk')} each needs "
                         f"{stages} stages, but the MLP has {layers} layers to cut; use at most "
                         f"{layers // virtual} devices")
    build(schedule, devices, microbatches, virtual)  # e.g. interleaved_1f1b's multiple of the devices
    if batch % microbatches:
        raise UsageError(f"a batch of {batch} rows does not split into {microbatches} equal microbatches: "
                         f"give a batch that is a multiple of {microbatches}")
    return devices, virtual


def run_demo(schedule: str = "1f1b", devices: int | None = None, microbatches: int = 8, steps: int = 3,
             batch: int = 64, hardware: str | None = "h100-node", check: bool = True,
             costs: dict[str, float] | None = None, virtual: int | None = None) -> DemoRun:
    """Train the MLP for ``steps`` steps on ``devices`` pipeline devices, each holding ``virtual``
    model chunks (default: the schedule's own, 1 or 2), so the MLP is cut into devices × virtual
    stages; by default the 4-stage MLP (4 devices, or 2 for two-chunk schedules).  With
    ``check``, compare against single-process training (float64).  ``costs`` ({kind: cost units}):
    model each action at that cost on a 1 FLOP/s device with free links instead of ``hardware``,
    so the modelled clock counts cost units (the textbook picture)."""
    devices, virtual = plan_demo(schedule, devices, microbatches, batch, virtual)
    dtype = np.float64 if check else np.float32
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, SIZES[0])).astype(dtype)
    y = rng.standard_normal((batch, SIZES[-1])).astype(dtype)
    model = seed_mlp(dtype)
    stages = devices * virtual
    pipe = Pipeline.balanced(model, stages, by="params")
    op = PipelinedOperation(pipe, schedule, microbatches=microbatches, optimizer=nn.SGD(0.01), costs=costs,
                            virtual=virtual)
    if costs is not None:
        op.clock_unit = "unit"  # the modelled clock counts cost units: titles and axes say so
    with VirtualCluster(devices, hardware=Hardware.unit() if costs is not None else hardware) as cluster:
        losses = [cluster.execute(op, x, y) for _ in range(steps)]
        state = op.state_dict(cluster)
        clock = max(cluster.clocks())
    matches = None
    if check:
        ref_losses, ref_state = nn.reference_train(seed_mlp(dtype), [(x, y)], nn.mse_loss, nn.SGD(0.01),
                                                   steps, microbatches)
        matches = bool(np.allclose(losses, ref_losses, rtol=1e-9) and all(
            np.allclose(state[k], ref_state[k], rtol=1e-9, atol=1e-12) for k in ref_state))
    return DemoRun(schedule, devices, virtual, stages, microbatches, batch, [float(v) for v in losses],
                   float(clock), costs, hardware, op, matches)


def report(out: TextIO, run: DemoRun, steps: int, clock: str = "model", width: int | None = None) -> None:
    """The demo's text: losses, modelled time, the last step's timeline, the check; ``width``: fold
    the timeline's steps into blocks of at most that many columns."""
    chunks = f" ({run.virtual} chunks each)" if run.virtual > 1 else ""
    losses = ", ".join(f"{v:.4f}" for v in run.losses)  # 4 decimals: the steps' losses differ there
    out.write(f"{run.schedule}: {run.stages} stages on {run.devices} devices{chunks} x {run.microbatches} "
              f"microbatches, batch {run.batch}; losses {losses}\n")
    if run.costs is not None:
        given = ", ".join(f"{k} = {number(v)}" for k, v in run.costs.items())
        out.write(f"modelled with {given} cost units on free links: {steps} steps took {number(run.clock)} "
                  "units\n")
    else:
        out.write(f"modelled time of {steps} steps on {run.hardware}: {seconds(run.clock)}\n")
    out.write(f"the last step as it ran ({'modelled' if clock == 'model' else 'wall'} clock; F forward, "
              f"B backward, I/W split backward):\n")
    out.write(str(run.op.timeline(clock=clock, **({} if width is None else {"width": width}))) + "\n")
    if run.matches is not None:
        out.write(f"matches single-process training (float64, 1e-9): {'yes' if run.matches else 'NO'}\n")


def train_demo(out: TextIO, schedule: str = "1f1b", devices: int | None = None, microbatches: int = 8,
               steps: int = 3, batch: int = 64, hardware: str | None = "h100-node", check: bool = True,
               unit: bool = False, virtual: int | None = None, costs: dict[str, float] | None = None,
               width: int | None = None) -> bool:
    """:func:`run_demo` printed by :func:`report`; ``unit``: every kind the schedule runs costs 1 unit.
    Returns False only when the check ran and failed."""
    if unit and costs is None:
        costs = {k: 1.0 for k in used_kinds(schedule)}
    run = run_demo(schedule, devices, microbatches, steps, batch, hardware, check, costs, virtual)
    report(out, run, steps, width=width)
    return run.matches is not False


def tour_section(out: TextIO, hardware: str | None) -> bool:
    out.write("Seed 003's MLP (256-512-1024-512-256) cut into 4 stages on 4 devices, trained with 1F1B.\n")
    ok = train_demo(out, "1f1b", devices=4, microbatches=8, steps=2, batch=32, hardware=hardware, unit=True,
                    width=WIDTH)
    out.write("Try: virtualpar schedule zb_h1 --png zb_h1.png   (the same peak memory, a smaller bubble)\n")
    return ok
