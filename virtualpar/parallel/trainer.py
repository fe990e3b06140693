"""``ParallelTrainer``: one training step of a GPT over DP × TP × PP × CP, with ZeRO, SP and recompute.

    cfg = ParallelConfig(dp=2, tp=2, pp=2, microbatches=2, zero=1, sequence_parallel=True)
    trainer = ParallelTrainer(nn.GPT.preset("tiny"), cfg, optimizer=nn.AdamW(1e-3))
    with VirtualCluster(cfg.mesh()) as cluster:
        loss = cluster.execute(trainer, tokens, targets)     # one step: the mean token loss
        weights = trainer.state_dict(cluster)                # keyed like model.state_dict()
        trainer.save(cluster, "ckpt/")                       # loads into any layout (.checkpoints)

Composed, not stacked: the driver cuts the model into pipeline stages of units
(:mod:`.layout`), gives each device its tensor-parallel shards (and under ZeRO-3 its dp shard of
them), and each step runs the ONE pipeline executor (:func:`virtualpar.pipeline.device_step.run_step`)
with a stage program (:mod:`.stage`) whose layers (:mod:`.layers`) are written once over the
differentiable collectives; :mod:`.zero` reduces the gradients and steps the optimizer.  Batch rows
go to dp replicas (then microbatches), sequence chunks to cp ranks; every configuration is checked
in the driver before a device runs (:class:`.ParallelConfig`).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from .. import nn
from ..errors import UsageError
from ..pipeline import build, lower, simulate, validate
from ..pipeline.executor import StepSpec
from ..pipeline.timeline_grid import format_timeline
from .checkpoints import TrainerCheckpoints
from .committed import fetch_weights, step_keeping
from .config import ParallelConfig
from .device_step import place
from .layout import stage_units
from .memory import ledger
from .overlap import on_grads
from .spmd import assemble, rank_batch, rank_init, skeleton
from .stage import stage_forward

__all__ = ["ParallelTrainer"]

_IDS = itertools.count()


class ParallelTrainer(TrainerCheckpoints):
    """One training step of ``model`` (an ``nn.GPT``) under ``config``, run by ``cluster.execute``.

    ``optimizer``: elementwise (``nn.SGD``, ``nn.Adam``, ``nn.AdamW``; default AdamW(1e-3)), copied
    per stage on every device.  ``cuts``: the blocks that start a stage (``["blocks.3"]``), else the
    blocks are split evenly over pp × virtual stages.  A trainer is one training run: ``step``
    counts its committed steps, and a cluster that does not hold the last of them (a new one after
    a device died) gets it placed before its step; ``save``, ``load`` and ``configure_recovery``
    come from :mod:`.checkpoints` (:mod:`virtualpar.checkpoint`)."""

    def __init__(self, model: nn.GPT, config: ParallelConfig, optimizer: nn.Optimizer | None = None,
                 cuts: list[str] | None = None) -> None:
        if not isinstance(model, nn.GPT):
            raise UsageError(f"ParallelTrainer needs an nn.GPT, got {type(model).__name__}")
        if not isinstance(config, ParallelConfig):
            raise UsageError(f"ParallelTrainer: config must be a ParallelConfig, got {type(config).__name__}")
        config.check_model(model, cuts)
        self.model, self.config = model, config
        self.optimizer = optimizer if optimizer is not None else nn.AdamW(1e-3)
        pad = 1 if config.zero == 0 else config.dp  # ZeRO's shards: flat vectors padded to a multiple of dp
        self.units = stage_units(model, config.stages, config.tp, pad, cuts)
        self.key = f"parallel/{next(_IDS)}"  # per cluster (PlacedOperation): "spec", "version", "spill"
        self.last_records: dict[int, list] = {}
        self.last_step_time = 0.0  # modelled seconds of the last step (the slowest device)
        self.last_step_times: list[float] = []  # per device: how far its modelled clock moved

    # -- planning -------------------------------------------------------------------------------------
    def _plan(self) -> tuple[StepSpec, Any]:
        cfg = self.config
        schedule, placement = build(cfg.schedule, cfg.pp, cfg.microbatches, cfg.chunks)
        validate(schedule, placement, cfg.microbatches)
        simulate(schedule, placement, cfg.microbatches)
        spec = StepSpec(lower(schedule, placement), placement, cfg.microbatches, None, "pp", None, None,
                        stage_forward=stage_forward, on_grads=on_grads)
        return spec, placement

    def _meta(self) -> dict[str, Any]:
        cfg = self.config
        return {"dp": cfg.dp, "tp": cfg.tp, "cp": cfg.cp, "sp": cfg.sequence_parallel, "zero": cfg.zero,
                "recompute": cfg.recompute, "bucket_bytes": cfg.bucket_bytes}

    def _ensure_placed(self, cluster: Any) -> StepSpec:
        """The step planned for ``cluster``; the first time, the model's weights placed there."""
        self.config.check_mesh(cluster.mesh)
        spec = (self.state_for(cluster) or {}).get("spec")
        if spec is None:
            spec, _ = self._plan()
            self._place(cluster, spec)
            self.hold(cluster, spec=spec)
        return spec

    def _place(self, cluster: Any, spec: StepSpec) -> None:
        full, twin = self.model.state_dict(), skeleton(self.model)
        for r in range(cluster.mesh.size):
            cluster.put(r, self.key + "/init", rank_init(self, spec, cluster.mesh, r, twin, full))
        cluster.run(place, self.key)

    def stage_flops(self, seq: int) -> dict[int | str, float]:
        """Forward FLOPs per sequence (one batch row) of each stage on one device, from the layers'
        ``flops_per_token`` (the head's 2·d·vocab on the last stage), divided over tp and cp; under
        ``"block"`` one block's, which recomputation repeats in the backward."""
        m, cfg = self.model, self.config
        head = m.flops_per_token(seq) - sum(b.flops_per_token(seq) for b in m.blocks)
        per_unit = {u.name: (m.blocks[int(u.name[7:])].flops_per_token(seq) if u.name.startswith("blocks.")
                             else head if u.name == "final" else 0.0) * seq / (cfg.tp * cfg.cp)
                    for units in self.units for u in units}
        out: dict = {s: sum(per_unit[u.name] for u in units) for s, units in enumerate(self.units)}
        out["units"] = per_unit  # per unit: zero=0's buckets overlap the backward unit by unit (.overlap)
        out["block"] = m.blocks[0].flops_per_token(seq) * seq / (cfg.tp * cfg.cp)  # recompute's repeat
        return out

    # -- running --------------------------------------------------------------------------------------
    def execute_on(self, cluster: Any, tokens: Any, targets: Any) -> float:
        cfg, mesh = self.config, cluster.mesh
        cfg.check_mesh(mesh)
        tokens = self.model.check_tokens(tokens)
        targets = np.asarray(targets)
        if targets.shape != tokens.shape or targets.dtype.kind not in "iu":
            raise UsageError(f"ParallelTrainer: targets must be integers of the tokens' shape "
                             f"{tokens.shape}, got {targets.dtype} of shape {targets.shape}")
        if targets.min() < 0 or targets.max() >= self.model.vocab:
            raise UsageError(f"ParallelTrainer: targets must lie in 0..{self.model.vocab - 1}, got "
                             f"{targets.min()}..{targets.max()}")
        cfg.check_batch(tokens.shape, self.model.seq_len)
        spec = self._ensure_placed(cluster)
        self._resume(cluster)  # the last committed state, if this cluster lacks it (checkpoint/recovery.py)
        rows, seq = tokens.shape[0] // cfg.dp, tokens.shape[1]
        for r in range(mesh.size):
            x, y = rank_batch(cfg, spec, mesh, r, tokens, targets)
            if x is not None:
                cluster.put(r, self.key + "/x", x, block=False)
            if y is not None:
                cluster.put(r, self.key + "/y", y, block=False)
        before = cluster.clocks()
        try:
            replies = cluster.run(step_keeping, self.key, rows, self._held(cluster),
                                  self._recovery.driver_copy, self.stage_flops(seq), self.step)
        except BaseException:
            self._failed(cluster)
            raise
        self._commit(cluster, [r[3] for r in replies])
        after = cluster.clocks()
        self.last_step_times = [b - a for a, b in zip(before, after)]
        self.last_step_time = max(after) - max(before)
        self.last_records = {}
        for _, prank, records, _ in replies:
            self.last_records.setdefault(prank, records)
        losses = [r[0] for r in replies if r[0] is not None]  # as many per replica: tp, cp agree
        return float(np.mean(losses))

    def state_dict(self, cluster: Any) -> dict[str, np.ndarray]:
        """The trained weights, gathered from the devices, keyed like ``model.state_dict()``."""
        if not self.is_placed_on(cluster):
            raise UsageError(f"ParallelTrainer {self.key!r} has not run on this cluster, so it holds none "
                             f"of its weights; run a step first: cluster.execute(trainer, tokens, targets)")
        parts = cluster.run(fetch_weights, self.key, self._held_current(cluster))
        return assemble(self, cluster.mesh, parts)

    def memory(self, cluster: Any) -> list[dict[str, Any]]:
        """Per device (rank order), the memory ledger of the last step, measured on the device:
        bytes of ``params``, ``grads``, ``optimizer`` state, peak ``activations`` and, per stage, the
        activations one microbatch keeps (``stage_activations``); see :mod:`.memory`."""
        if not self.is_placed_on(cluster):
            raise UsageError(f"ParallelTrainer {self.key!r} has not run on this cluster; run a step first")
        return cluster.run(ledger, self.key)

    def timeline(self, clock: str = "model", compute_only: bool = True) -> str:
        """Pipeline rank × time grid of the last step as it ran (the first device of each pipeline
        rank), on the ``clock`` "model" or "wall" — the executor's own view of its actions."""
        if clock not in ("model", "wall"):
            raise UsageError(f"unknown clock {clock!r}; choose one of 'model', 'wall'")
        if not self.last_records:
            raise UsageError("ParallelTrainer.timeline: no step has run yet; run cluster.execute(trainer, "
                             "...)")
        rows = {p: [(a, (m0, m1) if clock == "model" else (w0, w1))
                    for a, w0, w1, m0, m1 in recs] for p, recs in sorted(self.last_records.items())}
        return format_timeline(rows, compute_only)
