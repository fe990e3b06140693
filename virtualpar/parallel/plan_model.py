"""The planner's model of one configuration's step: time, its causes, and memory per device.  Pure.

For one configuration (b = rows per microbatch and replica, s = sequence per cp rank, h = d_model,
t = tp, α–β the links of the group's axis, F = a stage's forward FLOPs per microbatch); every
collective's time is :mod:`virtualpar.sim.analytic`'s (``ring_all_reduce``, ``ring_all_gather``,
``ring_reduce_scatter``, ``p2p``), the one place the α–β forms are defined:

- **Stage times** go to the pipeline simulator (:func:`virtualpar.pipeline.simulate`): per stage,
  F = F_flops/peak + its tensor-parallel collectives (blocking, inside the forward: 2 ring
  all-reduces of b·s·h per layer, or with SP an all-gather and a reduce-scatter each, plus the
  vocabulary-parallel ends) + cp's ring attention (cp−1 K,V blocks per layer) + ZeRO-3's all-gather
  of each unit over dp; B = 2·F_flops/peak (+ F_flops of the blocks with recompute) + the
  backward's collectives, ZeRO-3's second all-gather of each unit (FSDP frees it after the
  forward; a recomputed block gathers for its recomputation instead) and its reduce-scatter — 3
  per unit and microbatch, 2 for tied embeddings, which keep theirs (I and W halve B's compute for
  the zero-bubble schedules); ``comm`` = one activation's p2p (α + b·s·h/(t if SP)/β).  The
  simulated makespan holds the **bubble**.
- **Data parallelism, zero=0**: DDP's buckets (:func:`.zero.buckets`) all-reduced over dp·cp on each
  rank's communication stream from each stage's last backward on, as :mod:`.overlap` runs them:
  bucket k starts at max(r_k, c_{k−1}) (r_k: when its last unit's gradient is final in that
  backward's compute, c_{k−1}: the stream's previous end, any stage of the rank) and takes
  2(N−1)(α + B_k/(N·β)); the compute stream goes on (the simulated schedule is not held back) and a
  rank's step ends at max(its last action, its stream) (:func:`.plan_dp.overlapped`).  **zero 1**:
  reduce-scatter + all-gather of each unit after the pipeline (exposed), and the cp sum for zero 1
  and 3.
- **Memory** per pipeline rank: ZeRO's (P + G + K)·Ψ/… (:func:`.costs.zero_memory`) + Megatron's
  activations per layer, with dropout's masks if the model drops out, as the devices keep them
  (:func:`.costs.megatron_activation_bytes`) × its layers, plus the output end's on the head's
  stage (:func:`.costs.head_activation_bytes`), × the microbatches the schedule keeps in flight (the
  simulator's ``peak_activations``).

The figures are the same closed forms :mod:`.costs` checks against executed runs; the ranking is
confirmed on the modelled clock of real runs by ``virtualpar plan --confirm`` and the tests.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field
from typing import Any

from ..pipeline import build, simulate, validate
from ..sim.analytic import p2p, ring_all_gather, ring_all_reduce, ring_reduce_scatter
from .config import ParallelConfig
from .costs import head_activation_bytes, megatron_activation_bytes, model_flops, zero_memory
from .layout import stage_units
from .plan_dp import dp_after, last_backwards, overlapped

__all__ = ["Estimate", "estimate", "device_memory"]


@dataclass(frozen=True)
class Estimate:
    """One configuration's modelled step: ``step_time`` = ``pipeline`` (compute, tp/cp collectives,
    p2p and zero=0's overlapped buckets on the simulated schedule) + the reduction after it;
    ``dp_comm`` is the data-parallel communication exposed (that reduction, or zero=0's buckets'
    time past the backward they overlap, inside ``pipeline``); ``compute`` is the busiest rank's
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
    layers, plus the output end's on the head's stage, × the schedule's microbatches in flight) and
    ``total``."""
    units = _units(model, cfg.stages, cfg.tp, 1 if cfg.zero == 0 else cfg.dp)
    _, placement = _schedule(cfg.schedule, cfg.pp, cfg.microbatches, cfg.chunks)
    peaks = _peaks(cfg.schedule, cfg.pp, cfg.microbatches, cfg.chunks)
    b = batch // (cfg.dp * cfg.microbatches)
    per_layer = megatron_activation_bytes(seq // cfg.cp, b, model.d_model, model.n_heads, cfg.tp,
                                          cfg.sequence_parallel, cfg.recompute, itemsize,
                                          dropout=bool(getattr(model, "dropout", 0.0)))
    head = head_activation_bytes(seq // cfg.cp, b, model.d_model, model.vocab, cfg.tp, cfg.sequence_parallel,
                                 itemsize)
    kbytes = 2 * itemsize if optimizer_bytes is None else optimizer_bytes
    out = []
    for prank in range(cfg.pp):
        stages = placement.stages_of(prank)
        psi = sum(u.padded for s in stages for u in units[s])
        mem = zero_memory(psi, cfg.dp, cfg.zero, itemsize, kbytes)
        kept = {s: sum(per_layer if u.name.startswith("blocks.") else head if u.name == "final" else 0.0
                       for u in units[s]) for s in stages}
        mem["activations"] = float(sum(peaks[s] * kept[s] for s in stages))
        mem["total"] = sum(mem.values())
        out.append(mem)
    return out


def _unit_times(model: Any, units: list, seq: int, rows_tokens: float, peak: float) -> dict[str, float]:
    """Forward seconds of each unit on one device for ``rows_tokens`` = b·s/cp/tp tokens' share: a
    block's ``flops_per_token``, the head's on "final", nothing for the embeddings (as
    :meth:`.ParallelTrainer.stage_flops` declares them)."""
    head = model.flops_per_token(seq) - sum(blk.flops_per_token(seq) for blk in model.blocks)
    out = {}
    for u in units:
        if u.name.startswith("blocks."):
            per_token = model.blocks[int(u.name[7:])].flops_per_token(seq)
        else:
            per_token = head if u.name == "final" else 0.0
        out[u.name] = per_token * rows_tokens / peak
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
    tp_link, dp_link = links["tp"], links["dp"]
    units = _units(model, cfg.stages, t, 1 if cfg.zero == 0 else cfg.dp)
    fwd, bwd, inner, ftime, redo, unit_times = {}, {}, {}, {}, {}, {}
    per_token_block = model.blocks[0].flops_per_token(seq)
    tied = model.tie_embeddings
    for st, us in enumerate(units):
        layers = sum(u.name.startswith("blocks.") for u in us)
        unit_times[st] = _unit_times(model, us, seq, b * s_local / t, peak)
        ftime[st] = sum(unit_times[st].values())
        if cfg.sequence_parallel:  # an all-gather and a reduce-scatter where TP has an all-reduce
            coll = 2 * layers * 2 * ring_all_gather(t, bsh, *tp_link)
            coll_b = coll + 2 * layers * ring_all_gather(t, bsh, *tp_link)  # the gathered linears' repeat
        else:
            coll = coll_b = 2 * layers * ring_all_reduce(t, bsh, *tp_link)
        # the vocabulary-parallel ends: the embedding's g (forward), the loss's 3 all-reduces of b·s
        # (row max, sum of exponentials, the target's logit), the head's f (backward)
        ends = ring_all_reduce(t, bsh, *tp_link) if us[0].name == "embed" else 0.0
        ends_b = 0.0
        if us[-1].name == "final":
            ends += 3 * ring_all_reduce(t, b * s_local * itemsize, *tp_link)
            ends_b = ring_all_reduce(t, bsh, *tp_link)
        # ring attention: cp − 1 shifts of K and of V (b·s·h/t each) per layer, back again in the backward
        ring_attn = layers * (cfg.cp - 1) * 2 * p2p(bsh / t, *links["cp"]) if cfg.cp > 1 else 0.0
        redo[st] = layers * per_token_block * b * s_local / t / peak if cfg.recompute else 0.0
        again = coll + ring_attn if cfg.recompute else 0.0  # the recomputed forward's collectives
        # ZeRO-3 (FSDP, .fsdp): each unit's parameters all-gathered over dp before its forward, and
        # again before its backward (a recomputed block: for its recomputation), its gradient
        # reduce-scattered; tied embeddings keep their gathered parameters: no second gather
        z3_f = z3_b = 0.0
        if cfg.zero == 3:
            for u in us:
                moved = ring_all_gather(cfg.dp, u.padded * itemsize, *dp_link)
                z3_f += moved
                z3_b += ring_reduce_scatter(cfg.dp, u.padded * itemsize, *dp_link)
                if not (tied and u.name in ("embed", "final")):
                    z3_b += moved
        fwd[st] = ftime[st] + coll + ends + ring_attn + z3_f
        bwd[st] = 2 * ftime[st] + redo[st] + coll_b + ends_b + ring_attn + again + z3_b
        inner[st] = fwd[st] + bwd[st] - 3 * ftime[st] - redo[st]
    schedule, placement = _schedule(cfg.schedule, cfg.pp, m, cfg.chunks)
    kinds = {a.kind for acts in schedule.values() for a in acts if a is not None}
    costs: dict[str, Any] = {"F": fwd, "B": bwd}
    if "I" in kinds:  # zero bubble: B's input half carries the collectives, W one forward's FLOPs
        costs["W"] = dict(ftime)
        costs["I"] = {st: bwd[st] - ftime[st] for st in fwd}
    sp_time = 0.0
    if cfg.sequence_parallel and t > 1:  # per unit: its replicated entries (norms, biases; a few kB)
        sp_time = ring_all_reduce(t, 4 * h * itemsize, *tp_link)
    p2p_time = p2p(bsh / (t if cfg.sequence_parallel else 1), *links["pp"]) if cfg.pp > 1 else 0.0
    sim = simulate(schedule, placement, m, costs={k: v for k, v in costs.items() if k in kinds},
                   comm=p2p_time)
    ends = [0.0] * cfg.pp
    for r, _, e in sim.times.values():
        ends[r] = max(ends[r], e)
    streams = [0.0] * cfg.pp  # per pipeline rank: the end of its communication stream (.overlap)
    if cfg.zero == 0 and cfg.dp * cfg.cp > 1:  # DDP's buckets beside the rest of the step
        group, link = cfg.dp * cfg.cp, dp_link if cfg.dp > 1 else links["cp"]

        def bucket_time(n: float) -> float:
            return ring_all_reduce(group, n, *link)
        last = last_backwards(schedule, placement)
        for r, acts in schedule.items():  # each rank's stream in its program order
            for a in acts:
                if a is None or last.get(a.stage) != a:
                    continue
                st = a.stage
                charged = 2 * ftime[st] + redo[st] if a.kind == "B" else ftime[st]
                streams[r] = overlapped(units[st], unit_times[st], sim.times[a][2], charged, streams[r],
                                        itemsize, cfg.bucket_bytes, bucket_time, sp_time)
    pipeline_time = max(max(max(e, c) for e, c in zip(ends, streams)), sim.makespan)
    ranks = [placement.stages_of(pr) for pr in range(cfg.pp)]
    compute = max(sum(3 * ftime[st] + redo[st] for st in sts) * m for sts in ranks)
    comm_inside = max(sum(inner[st] for st in sts) * m for sts in ranks)
    after = max(dp_after(cfg, [u.padded * itemsize for st in sts for u in units[st]], links, sp_time)
                for sts in ranks)
    hidden_not = max(max(0.0, c - e) for e, c in zip(ends, streams))  # buckets past the compute
    mem = device_memory(model, cfg, batch, seq, itemsize)
    fullest = max(mem, key=lambda d: d["total"])
    step = pipeline_time + after
    mfu = model_flops(model, batch, seq) / (step * cfg.size * peak) if step > 0 else 0.0
    return Estimate(cfg, step, pipeline_time, compute, comm_inside, after + hidden_not, sim.bubble, fullest,
                    hardware.device.memory_capacity, mfu)
