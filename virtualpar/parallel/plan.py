"""The planner: every (dp, tp, pp, cp, microbatches, schedule, zero, sp, recompute) of a GPT on N
devices, ranked by modelled step time among those that fit device memory.  Pure: no process starts.

    fit, left_out = plan(nn.GPT.preset("small"), 64, "h100-cluster", batch=64)
    fit[0].label(), fit[0].step_time, fit[0].bubble, fit[0].exposed_comm, fit[0].memory

:func:`configurations` lists what divides the model and the batch; each is modelled by
:func:`.plan_model.estimate` (closed forms + the pipeline simulator: see that module for the math);
:func:`plan` keeps those that fit and sorts them, fastest first.  ``virtualpar plan --confirm`` and
the tests run the top ones and check the order on the modelled clock of real runs.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator

from ..errors import UsageError
from .config import ParallelConfig
from .plan_model import Estimate, _schedule, device_memory, estimate

__all__ = ["Estimate", "estimate", "configurations", "plan", "device_memory"]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def configurations(model: Any, devices: int, batch: int, seq: int,
                   max_microbatches: int = 16) -> Iterator[ParallelConfig]:
    """Every configuration of ``devices`` that divides ``model`` and the (batch, seq) batch: dp·tp·pp·cp =
    devices, microbatches dividing batch/dp (at most ``max_microbatches``), every schedule when pp > 1,
    zero 0/1/3 (1 and 3 only with dp > 1), SP with tp > 1, recompute on and off."""
    from ..pipeline.schedules import SCHEDULES

    for dp, tp, pp in itertools.product(_divisors(devices), repeat=3):
        if devices % (dp * tp * pp):
            continue
        cp = devices // (dp * tp * pp)
        if batch % dp:
            continue
        for m in _divisors(batch // dp):
            if m > max_microbatches:
                continue
            for schedule in (list(SCHEDULES) if pp > 1 else ["1f1b"]):
                for zero in ((0, 1, 3) if dp > 1 else (0,)):
                    for sp in ((False, True) if tp > 1 else (False,)):
                        for recompute in (False, True):
                            try:
                                cfg = ParallelConfig(dp=dp, tp=tp, pp=pp, cp=cp, microbatches=m,
                                                     schedule=schedule, zero=zero, sequence_parallel=sp,
                                                     recompute=recompute)
                                cfg.check_model(model)
                                cfg.check_batch((batch, seq), model.seq_len)
                                _schedule(schedule, pp, m, cfg.chunks)
                            except UsageError:
                                continue
                            yield cfg


def plan(model: Any, devices: int, hardware: Any, batch: int, seq: int | None = None, dtype: str = "float32",
         capacity: float | None = None, max_microbatches: int = 16) -> tuple[list[Estimate], int]:
    """(every configuration that fits, fastest first; how many did not fit).  ``capacity``: bytes per
    device (default the hardware's)."""
    from ..sim.hardware import get_hardware

    hw = get_hardware(hardware)
    seq = model.seq_len if seq is None else seq
    found = []
    for cfg in configurations(model, devices, batch, seq, max_microbatches):
        e = estimate(model, cfg, batch, seq, hw, dtype)
        if capacity is not None:
            e = Estimate(**{**e.__dict__, "capacity": float(capacity)})
        found.append(e)
    if not found:
        raise UsageError(f"plan: no configuration of {devices} devices divides the model (heads "
                         f"{model.n_heads}, layers {model.n_layers}, vocabulary {model.vocab}) and the batch "
                         f"({batch} × {seq})")
    fit = [e for e in found if e.fits]
    fit.sort(key=lambda e: (e.step_time, e.memory["total"], e.label()))
    return fit, len(found) - len(fit)
