"""A pipelined MLP trained on a real cluster, for ``virtualpar pipeline`` and the tour."""

from __future__ import annotations

from typing import TextIO

import numpy as np

from .. import nn
from .._words import counted
from ..errors import UsageError
from .executor import PipelinedOperation
from .partition import Pipeline
from .schedules import default_virtual

__all__ = ["train_demo", "tour_section", "seed_mlp"]

SIZES = (256, 512, 1024, 512, 256)


def seed_mlp(dtype=np.float32, sizes=SIZES) -> nn.Sequential:
    """Seed 003's MLP: dense layers 256→512→1024→512→256 with ReLU between them."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b, seed=i, dtype=dtype))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def unit_hardware():
    """Free links and a 1 FLOP/s device: with ``costs={"F": 1, "B": 2}`` the modelled clock counts
    schedule steps, so an executed run's timeline is the textbook picture."""
    from ..sim import Hardware
    from ..sim.hardware import DeviceSpec

    inf = float("inf")
    return Hardware.uniform(latency=0.0, bandwidth=inf, device=DeviceSpec("unit", {"float32": 1.0}, inf, inf))


def train_demo(out: TextIO, schedule: str = "1f1b", devices: int | None = None, microbatches: int = 8, steps: int = 3,
               batch: int = 64, hardware: str | None = "h100-node", check: bool = True, unit: bool = False,
               virtual: int | None = None) -> bool:
    """Train the MLP for ``steps`` steps on ``devices`` pipeline devices, each holding ``virtual``
    model chunks (default: the schedule's own, 1 or 2), so the MLP is cut into devices × virtual
    stages; by default the 4 stages of seed 003 (4 devices, or 2 for two-chunk schedules).  Print
    the losses and the last timeline; with ``check``, compare against single-process training
    (float64).  ``unit``: model F = 1 and B = 2 time units on free links instead of ``hardware``.
    Returns True if it matched."""
    from .. import VirtualCluster  # the driver side of a demo; the device program uses the protocol only

    virtual = default_virtual(schedule) if virtual is None else virtual
    for name, value in (("devices", devices), ("virtual", virtual)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UsageError(f"{name} must be a positive int, got {value!r}")
    if devices is None:
        devices = max(1, 4 // virtual)
    dtype = np.float64 if check else np.float32
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, SIZES[0])).astype(dtype)
    y = rng.standard_normal((batch, SIZES[-1])).astype(dtype)
    model = seed_mlp(dtype)
    stages = devices * virtual
    if not 1 <= stages <= len(model):
        raise UsageError(f"{schedule} on {devices} devices with {counted(virtual, 'model chunk')} each needs {stages} stages, but "
                         f"the MLP has {len(model)} layers to cut; use at most {len(model) // virtual} devices")
    pipe = Pipeline.balanced(model, stages, by="params")
    costs = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0} if unit else None
    op = PipelinedOperation(pipe, schedule, microbatches=microbatches, optimizer=nn.SGD(0.01), costs=costs,
                            virtual=virtual)
    with VirtualCluster(devices, hardware=unit_hardware() if unit else hardware) as cluster:
        losses = [cluster.execute(op, x, y) for _ in range(steps)]
        state = op.state_dict(cluster)
        clock = max(cluster.clocks())
    chunks = f" ({virtual} chunks each)" if virtual > 1 else ""
    out.write(f"{schedule}: {stages} stages on {devices} devices{chunks} x {microbatches} microbatches, batch {batch}; "
              f"losses {', '.join(f'{v:.4f}' for v in losses)}\n")
    if unit:
        out.write(f"modelled with F = 1, B = 2 (I = W = 1) time units on free links: {steps} steps took {clock:g} units\n")
    else:
        out.write(f"modelled time of {steps} steps on {hardware}: {clock * 1e3:.3f} ms\n")
    out.write("the last step as it ran (modelled clock; F forward, B backward, I/W split backward):\n")
    out.write(op.timeline() + "\n")
    if not check:
        return True
    ref_losses, ref_state = nn.reference_train(seed_mlp(dtype), [(x, y)], nn.mse_loss, nn.SGD(0.01), steps, microbatches)
    ok = np.allclose(losses, ref_losses, rtol=1e-9) and all(
        np.allclose(state[k], ref_state[k], rtol=1e-9, atol=1e-12) for k in ref_state)
    out.write(f"matches single-process training (float64, 1e-9): {'yes' if ok else 'NO'}\n")
    return ok


def tour_section(out: TextIO, hardware: str | None) -> bool:
    out.write("Seed 003's MLP (256-512-1024-512-256) cut into 4 stages on 4 devices, trained with 1F1B.\n")
    ok = train_demo(out, "1f1b", devices=4, microbatches=8, steps=2, batch=32, hardware=hardware, unit=True)
    out.write("Try: virtualpar schedule zb_h1 --costs F=1,B=2,W=1   (same memory, smaller bubble)\n")
    return ok
