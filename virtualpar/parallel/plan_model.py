"""The planner's model of one configuration's step: time, its causes, and memory per device.  Pure.

For one configuration (b = rows per microbatch and replica, s = sequence per cp rank, h = d_model,
t = tp, α–β the links of the group's axis, F = a stage's forward FLOPs per microbatch):

- **Stage times** go to the pipeline simulator (:func:`virtualpar.pipeline.simulate`): per stage,
  F = F_flops/peak + its tensor-parallel collectives (blocking, inside the forward: 2 ring
  all-reduces of b·s·h per layer, or with SP an all-gather and a reduce-scatter each, plus the
  vocabulary-parallel ends) + cp's ring attention (cp−1 K,V blocks per layer) + ZeRO-3's all-gather
  of each unit's parameters over dp (FSDP, on the stage's path); B = 2·F_flops/peak
  (+ F_flops of the blocks with recompute) + the backward's collectives, ZeRO-3's reduce-scatter
  (and its gather again with recompute) included (I and W halve B's compute
  for the zero-bubble schedules); ``comm`` = one activation's p2p (α + b·s·h/(t if SP)/β).  The
  simulated makespan holds the **bubble**.
- **Data parallelism** after the backward (exposed, the gradient reduction blocks here):
  ring all-reduce 2(N_d−1)(α + Ψ/(N_d·β)) for zero 0 (and the cp sum), reduce-scatter +
  all-gather of each unit for zero 1 (zero=0 reduces buckets, zero 1 and 3 unit by unit).
- **Memory** per pipeline rank: ZeRO's (P + G + K)·Ψ/… (:func:`.costs.zero_memory`) + Megatron's
  activations per layer (:func:`.costs.megatron_activation_bytes`) × its layers × the microbatches the
  schedule keeps in flight (the simulator's ``peak_activations``).

The figures are the same closed forms :mod:`.costs` checks against executed runs; the ranking is
confirmed on the modelled clock of real runs by ``virtualpar plan --confirm`` and the tests.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field
from typing import Any

from ..pipeline import build, simulate, validate
from .config import ParallelConfig
from .costs import megatron_activation_bytes, model_flops, zero_memory
from .layout import stage_units

__all__ = ["Estimate", "estimate", "device_memory"]


@dataclass(frozen=True)
class Estimate:
    """One configuration's modelled step: ``step_time`` = ``pipeline`` (compute, tp/cp collectives
    and p2p on the simulated schedule) + ``dp_comm`` (exposed); ``compute`` is the busiest rank's
    FLOPs time, ``bubble`` the schedule's idle fraction, ``comm`` the collectives' time inside the
    stages, ``memory`` the fullest device's bytes by kind, ``fits`` against ``capacity``."""

    config: ParallelConfig
    step_time: float
    pipeline: float
    compute: float
    comm: float
    dp_comm: float
    bubble: float
    memory: dict[str, float] = field(compare=False)
    capacity: float = float("inf")
    mfu: float = 0.0

    @property
    def fits(self) -> bool:
        return self.memory["total"] <= self.capacity

    @property
    def exposed_comm(self) -> float:
        return self.comm + self.dp_comm

    def label(self) -> str:
        c = self.config
        flags = "".join([" sp" if c.sequence_parallel else "", " recompute" if c.recompute else ""])
        return (f"dp={c.dp} tp={c.tp} pp={c.pp} cp={c.cp} M={c.microbatches} {c.schedule} "
                f"zero={c.zero}{flags}")

    def as_dict(self) -> dict[str, Any]:
        c = self.config
        return {"dp": c.dp, "tp": c.tp, "pp": c.pp, "cp": c.cp, "microbatches": c.microbatches,
                "schedule": c.schedule, "zero": c.zero, "sequence_parallel": c.sequence_parallel,
                "recompute": c.recompute, "step_seconds": self.step_time, "pipeline_seconds": self.pipeline,
                "compute_seconds": self.compute, "comm_seconds": self.comm, "dp_comm_seconds": self.dp_comm,
                "bubble": self.bubble, "memory_bytes": dict(self.memory), "fits": self.fits, "mfu": self.mfu}


def _links(hardware: Any, cfg: ParallelConfig) -> dict[str, tuple[float, float]]:
    """(α, β) of each axis' group: intra-node if the group lies inside one node (axes dp, pp, cp, tp
    are laid out with tp fastest), else the inter-node links."""
    out, stride = {}, 1
    for axis in ("tp", "cp", "pp", "dp"):
        size = getattr(cfg, axis)
        node = hardware.devices_per_node
        inside = node is None or stride * size <= node or not hardware.multi_node
        out[axis] = ((hardware.intra_latency, hardware.intra_bandwidth) if inside
                     else (hardware.inter_latency, hardware.inter_bandwidth))
        stride *= size
    return out


def _ring(n: int, nbytes: float, link: tuple[float, float], steps_per: int = 2) -> float:
    """Ring collective time: ``steps_per``·(n−1) steps of nbytes/n (2 for all-reduce, 1 for
    all-gather or reduce-scatter)."""
    if n == 1:
        return 0.0
    alpha, beta = link
    return steps_per * (n - 1) * (alpha + nbytes / n / beta)


class _Shapes:
    """What :func:`stage_units` reads of a model (its parameters' names and shapes, its layers),
    without the arrays: the planner lays out thousands of configurations of one model."""

    def __init__(self, shapes: tuple[tuple[str, tuple[int, ...]], ...], n_layers: int) -> None:
        self.shapes, self.n_layers = shapes, n_layers

    def state_dict(self) -> dict[str, Any]:
        return {k: _Shape(v) for k, v in self.shapes}


@dataclass(frozen=True)
class _Shape:
    shape: tuple[int, ...]


_SEEN: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()


def _units(model: Any, stages: int, tp: int, pad: int) -> list:
    shapes = _SEEN.get(model)
    if shapes is None:
        shapes = _SEEN[model] = tuple((k, tuple(v.shape)) for k, v in model.state_dict().items())
    return _cached_units(shapes, model.n_layers, stages, tp, pad)


@functools.lru_cache(maxsize=1024)
def _cached_units(shapes: tuple, n_layers: int, stages: int, tp: int, pad: int) -> list:
    return stage_units(_Shapes(shapes, n_layers), stages, tp, pad)


@functools.lru_cache(maxsize=4096)
def _schedule(name: str, pp: int, m: int, chunks: int) -> Any:
    schedule, placement = build(name, pp, m, chunks)
    validate(schedule, placement, m)
    return schedule, placement


def _peaks(name: str, pp: int, m: int, chunks: int) -> list[int]:
    schedule, placement = _schedule(name, pp, m, chunks)
    return simulate(schedule, placement, m).peak_activations


def device_memory(model: Any, cfg: ParallelConfig, batch: int, seq: int, itemsize: int,
                  optimizer_bytes: int | None = None) -> list[dict[str, float]]:
    """Per pipeline rank, the closed-form bytes of one device: ``params``, ``grads``, ``optimizer``
    (ZeRO by stage; Adam's 2 moments by default), ``activations`` (Megatron's per-layer form × its
    layers × the schedule's microbatches in flight) and ``total``."""
    units = _units(model, cfg.stages, cfg.tp, 1 if cfg.zero == 0 else cfg.dp)
    _, placement = _schedule(cfg.schedule, cfg.pp, cfg.microbatches, cfg.chunks)
    peaks = _peaks(cfg.schedule, cfg.pp, cfg.microbatches, cfg.chunks)
    b = batch // (cfg.dp * cfg.microbatches)
    per_layer = megatron_activation_bytes(seq // cfg.cp, b, model.d_model, model.n_heads, cfg.tp,
                                          cfg.sequence_parallel, cfg.recompute, itemsize)
    kbytes = 2 * itemsize if optimizer_bytes is None else optimizer_bytes
    out = []
    for prank in range(cfg.pp):
        stages = placement.stages_of(prank)
        psi = sum(u.padded for s in stages for u in units[s])
        mem = zero_memory(psi, cfg.dp, cfg.zero, itemsize, kbytes)
        layers = {s: sum(u.name.startswith("blocks.") for u in units[s]) for s in stages}
        mem["activations"] = float(sum(peaks[s] * layers[s] * per_layer for s in stages))
        mem["total"] = sum(mem.values())
        out.append(mem)
    return out


def estimate(model: Any, cfg: ParallelConfig, batch: int, seq: int, hardware: Any,
             dtype: str = "float32") -> Estimate:
    """The modelled step of ``cfg`` (see the module doc) on ``hardware`` (a
    :class:`~virtualpar.sim.Hardware`)."""
    import numpy as np

    cfg.check_model(model)
    cfg.check_batch((batch, seq), model.seq_len)
    itemsize = np.dtype(dtype).itemsize
    peak = hardware.device.peak(dtype)
    links = _links(hardware, cfg)
    t, h, m = cfg.tp, model.d_model, cfg.microbatches
    b = batch // (cfg.dp * m)
    s_local = seq // cfg.cp
    bsh = b * s_local * h * itemsize
    units = _units(model, cfg.stages, t, 1)
    fwd, bwd, inner, ftime, redo = {}, {}, {}, {}, {}
    per_token_block = model.blocks[0].flops_per_token(seq)
    head = model.flops_per_token(seq) - sum(blk.flops_per_token(seq) for blk in model.blocks)
    for st, us in enumerate(units):
        layers = sum(u.name.startswith("blocks.") for u in us)
        per_token = layers * per_token_block + (head if us[-1].name == "final" else 0.0)
        ftime[st] = per_token * b * s_local / t / peak
        if cfg.sequence_parallel:  # an all-gather and a reduce-scatter where TP has an all-reduce
            coll = 2 * layers * 2 * _ring(t, bsh, links["tp"], 1)
            coll_b = coll + 2 * layers * _ring(t, bsh, links["tp"], 1)  # the gathered linears' repeat
        else:
            coll = coll_b = 2 * layers * _ring(t, bsh, links["tp"])
        # the vocabulary-parallel ends: the embedding's g (forward), the loss's 3 all-reduces of b·s
        # (row max, sum of exponentials, the target's logit), the head's f (backward)
        ends = _ring(t, bsh, links["tp"]) if us[0].name == "embed" else 0.0
        ends_b = 0.0
        if us[-1].name == "final":
            ends += 3 * _ring(t, b * s_local * itemsize, links["tp"])
            ends_b = _ring(t, bsh, links["tp"])
        # ring attention: cp − 1 shifts of K and of V (b·s·h/t each) per layer, back again in the backward
        ring_attn = layers * (cfg.cp - 1) * 2 * (links["cp"][0] + bsh / t / links["cp"][1])
        redo[st] = layers * per_token_block * b * s_local / t / peak if cfg.recompute else 0.0
        again = coll + ring_attn if cfg.recompute else 0.0  # the recomputed forward's collectives
        # ZeRO-3 (FSDP): each unit's parameters all-gathered over dp where its forward runs (again in
        # the backward with recompute), its gradient reduce-scattered in the backward: on the stage's path
        z3 = 0.0
        if cfg.zero == 3:
            z3 = sum(_ring(cfg.dp, u.size * itemsize, links["dp"], 1) for u in us)
        fwd[st] = ftime[st] + coll + ends + ring_attn + z3
        bwd[st] = 2 * ftime[st] + redo[st] + coll_b + ends_b + ring_attn + again + z3 * (1 + cfg.recompute)
        inner[st] = fwd[st] + bwd[st] - 3 * ftime[st] - redo[st]
    schedule, placement = _schedule(cfg.schedule, cfg.pp, m, cfg.chunks)
    kinds = {a.kind for acts in schedule.values() for a in acts if a is not None}
    costs: dict[str, Any] = {"F": fwd, "B": bwd}
    if "I" in kinds:  # zero bubble: B's input half carries the collectives, W one forward's FLOPs
        costs["W"] = dict(ftime)
        costs["I"] = {st: bwd[st] - ftime[st] for st in fwd}
    p2p = links["pp"][0] + bsh / (t if cfg.sequence_parallel else 1) / links["pp"][1] if cfg.pp > 1 else 0.0
    sim = simulate(schedule, placement, m, costs={k: v for k, v in costs.items() if k in kinds}, comm=p2p)
    ranks = [placement.stages_of(pr) for pr in range(cfg.pp)]
    compute = max(sum(3 * ftime[st] + redo[st] for st in sts) * m for sts in ranks)
    comm_inside = max(sum(inner[st] for st in sts) * m for sts in ranks)
    sp_bytes = 0.0
    if cfg.sequence_parallel and t > 1:  # per unit: its replicated entries (norms, biases; a few kB)
        sp_bytes = 4 * h * itemsize
    dp_comm = max(_dp_time(cfg, [u.size * itemsize for st in sts for u in units[st]], links, sp_bytes)
                  for sts in ranks)
    mem = device_memory(model, cfg, batch, seq, itemsize)
    fullest = max(mem, key=lambda d: d["total"])
    step = sim.makespan + dp_comm
    mfu = model_flops(model, batch, seq) / (step * cfg.size * peak) if step > 0 else 0.0
    return Estimate(cfg, step, sim.makespan, compute, comm_inside, dp_comm, sim.bubble, fullest,
                    hardware.device.memory_capacity, mfu)


def _dp_time(cfg: ParallelConfig, unit_bytes: list[float], links: dict, sp_bytes: float = 0.0) -> float:
    """One pipeline rank's gradient reduction and ZeRO traffic (:mod:`.zero`): zero=0 all-reduces
    buckets of ``bucket_bytes`` over dp × cp; zero 1 and 3 reduce each unit's flat vector on its own
    (the cp sum, then for zero=1 reduce-scatter + all-gather; zero=3's gathers and reduce-scatters
    run inside the stages, where :func:`estimate` counts them)."""
    total = 0.0
    if cfg.zero == 0:
        if sp_bytes:
            total += len(unit_bytes) * _ring(cfg.tp, sp_bytes, links["tp"])
        group = cfg.dp * cfg.cp
        link = links["dp"] if cfg.dp > 1 else links["cp"]
        buckets, size = [], 0.0
        for n in unit_bytes:
            if size and size + n > cfg.bucket_bytes:
                buckets.append(size)
                size = 0.0
            size += n
        buckets.append(size)
        return total + sum(_ring(group, n, link) for n in buckets)
    for n in unit_bytes:
        if sp_bytes:  # sequence parallelism: the replicated parameters' partial gradients, summed over tp
            total += _ring(cfg.tp, sp_bytes, links["tp"])
        total += _ring(cfg.cp, n, links["cp"])
        if cfg.zero == 1:
            total += 2 * _ring(cfg.dp, n, links["dp"], 1)
    return total
