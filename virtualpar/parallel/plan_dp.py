"""The planner's data-parallel gradient reduction: DDP's buckets beside the backward, ZeRO's after it.  Pure.

:func:`overlapped` is :mod:`.overlap`'s rule on closed forms — the end of a rank's communication
stream after a stage's zero=0 buckets, all-reduced beside the rest of the step from its last
backward (:func:`last_backwards`) on — which the planner runs on the simulated schedule;
:func:`dp_after` is what a pipeline rank reduces after its pipeline (zero 1's reduce-scatter and
all-gather, the cp sum, SP's replicated gradients).
Collective times are :mod:`virtualpar.sim.analytic`'s.
"""

from __future__ import annotations

from typing import Any, Callable

from ..sim.analytic import ring_all_gather, ring_all_reduce, ring_reduce_scatter
from .config import ParallelConfig
from .zero import buckets

__all__ = ["overlapped", "last_backwards", "dp_after"]


def overlapped(units: list, times: dict[str, float], end: float, compute: float, stream: float,
               itemsize: int, bucket_bytes: int, bucket_time: Callable[[float], float],
               sp_time: float) -> float:
    """The end of the communication stream (free from ``stream`` on) after a stage's buckets are
    all-reduced beside its last backward, whose compute of ``compute`` seconds ends at ``end``
    (:mod:`.overlap`'s two streams): unit u is final at end − compute · (the forward ``times`` of
    the units still to run after u) / (all of them); bucket k starts at max(r_k, c_{k−1})."""
    total = rest = sum(times[u.name] for u in units)
    clock = stream
    for bucket in buckets(units, itemsize, bucket_bytes):
        rest -= sum(times[u.name] for u in bucket)
        ready = end - compute * rest / total if total > 0 else end
        nbytes = sum(u.padded for u in bucket) * itemsize
        clock = max(clock, ready) + len(bucket) * sp_time + bucket_time(nbytes)
    return clock


def last_backwards(schedule: Any, placement: Any) -> dict[int, Any]:
    """Per stage, the backward after which its gradients are final (:func:`.overlap.on_grads`): the
    last B or W of the stage in its rank's order."""
    out = {}
    for acts in schedule.values():
        for a in acts:
            if a is not None and a.kind in ("B", "W"):
                out[a.stage] = a
    return out


def dp_after(cfg: ParallelConfig, unit_bytes: list[float], links: dict, sp_time: float = 0.0) -> float:
    """One pipeline rank's gradient reduction and ZeRO traffic after its pipeline (:mod:`.zero`): none
    for zero=0 over dp·cp > 1 (its buckets ran beside the backward, :func:`overlapped`), else the
    SP gradients' tp all-reduce per unit; zero 1 and 3 reduce each unit's flat vector on its own (the
    cp sum, then for zero=1 reduce-scatter + all-gather; zero=3's gathers and reduce-scatters run
    inside the stages, where :func:`.plan_model.estimate` counts them)."""
    if cfg.zero == 0:
        return 0.0 if cfg.dp * cfg.cp > 1 else len(unit_bytes) * sp_time
    total = 0.0
    link = links["dp"]
    for n in unit_bytes:
        total += sp_time  # sequence parallelism: the replicated parameters' partial gradients, over tp
        total += ring_all_reduce(cfg.cp, n, *links["cp"])
        if cfg.zero == 1:
            total += ring_reduce_scatter(cfg.dp, n, *link) + ring_all_gather(cfg.dp, n, *link)
    return total
