"""A ``ParallelTrainer`` driven SPMD: every device runs its own part of the host's work, no driver.

Under ``cluster.execute`` a driver places the shards, slices the batch and tells the devices when a
step committed.  Under ``mpiexec`` there is no driver: each rank holds the same model, the same
configuration and the same data (built from the same seed), so each can compute its own part of
that work deterministically.  This module is that part, written once per rank:

- :func:`rank_init`: what the driver puts on device ``rank`` (its stages' tp shards, ZeRO-3's
  dp shard, a copy of the optimizer per stage, the step plan);
- :func:`rank_batch`: its rows (dp) and sequence chunk (cp) of the batch, the tokens on the first
  pipeline stage's devices and the targets on the last's;
- :func:`assemble`: the model's weights from every device's flat vectors (what rank 0 gathers);

the driver (:class:`~.trainer.ParallelTrainer`) calls the same three for every rank, so the host's
logic exists once;
- :class:`SpmdTrainer`: the per-device program (:mod:`.device_step`'s ``place``, ``step``,
  ``fetch``) run by this device itself.  A step commits when the next begins: under ``mpiexec`` a
  failing rank aborts the job, so reaching the next step means every rank finished the last.

Device protocol only (``mesh``, ``rank``, ``state`` and the collectives the step itself calls);
nothing here talks to other processes outside the step, so the same program runs on the emulator
(``cluster.run``) and on :class:`virtualpar.mpi.MPIDevice` alike.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from .. import nn
from ..errors import UsageError
from .device_step import fetch, place, step
from .layout import flatten, shard, unshard
from .memory import ledger

__all__ = ["skeleton", "rank_init", "rank_batch", "assemble", "SpmdTrainer"]


def skeleton(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters are empty arrays of their dtype: its norms' forward, its
    flags and sizes, shipped to every device without the weights."""
    twin = copy.deepcopy(model)
    for _, owner, leaf, value in list(twin._slots()):
        object.__setattr__(owner, leaf, np.zeros(0, np.asarray(value).dtype))
    return twin


def rank_init(trainer: Any, spec: Any, mesh: Any, rank: int, twin: Any = None,
              full: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """What device ``rank`` of ``mesh`` holds before the first step: for each stage its pipeline
    rank runs, the units' flat vectors of this device's tp shard (1/dp of it under ZeRO-3) and a
    fresh copy of the optimizer; the step plan ``spec`` and the model's skeleton.  ``full``: the
    model's state dict (computed once by a caller looping over ranks)."""
    cfg, model = trainer.config, trainer.model
    full = model.state_dict() if full is None else full
    at = mesh.index(rank)
    params, optimizers = {}, {}
    for s in spec.placement.stages_of(at.pp):
        flats = {}
        for u in trainer.units[s]:
            flat = flatten(u, {n: shard(full[n], n, cfg.tp, at.tp) for n in u.names}, model.dtype)
            if cfg.zero == 3:
                flat = np.array_split(flat, cfg.dp)[at.dp].copy()
            flats[u.name] = flat
        params[s] = flats
        optimizers[s] = copy.deepcopy(trainer.optimizer)
    return {"spec": spec, "params": params, "optimizers": optimizers, "units": dict(enumerate(trainer.units)),
            "meta": trainer._meta(), "skeleton": skeleton(model) if twin is None else twin, "flops": {}}


def rank_batch(config: Any, spec: Any, mesh: Any, rank: int, tokens: np.ndarray, targets: np.ndarray
               ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Device ``rank``'s (tokens, targets) of a global batch: rows ``dp·b … (dp+1)·b`` (b = batch/dp)
    and sequence chunk ``cp``; tokens only on the first pipeline stage's devices, targets only on
    the last's (None elsewhere)."""
    p = spec.placement
    first, last = p.rank_of(0, 0), p.rank_of(p.stages - 1, 0)
    batch, seq = tokens.shape
    rows, chunk = batch // config.dp, seq // config.cp
    at = mesh.index(rank)
    part = (slice(at.dp * rows, (at.dp + 1) * rows), slice(at.cp * chunk, (at.cp + 1) * chunk))
    x = np.ascontiguousarray(tokens[part]) if at.pp == first else None
    y = np.ascontiguousarray(targets[part]) if at.pp == last else None
    return x, y


def assemble(trainer: Any, mesh: Any, parts: list[dict[int, dict[str, np.ndarray]]]) -> dict[str, np.ndarray]:
    """The model's weights (keyed like ``model.state_dict()``) from every device's stages' flat
    vectors, ``parts[rank]`` as :func:`~.device_step.fetch` returns them (dp = cp = 0 devices suffice)."""
    pieces: dict[str, list] = {}
    for r, stages in enumerate(parts):
        at = mesh.index(r)
        if at.dp or at.cp or stages is None:
            continue
        for s, flats in stages.items():
            for u in trainer.units[s]:
                for n, a, b, shape in u.offsets():
                    piece = flats[u.name][a:b].reshape(shape)
                    pieces.setdefault(n, [None] * trainer.config.tp)[at.tp] = piece
    out = {n: unshard(v, n) for n, v in pieces.items()}
    if trainer.model.tie_embeddings:
        out["head.embedding.weight"] = out["tok_emb.weight"]
    return {k: out[k].copy() for k in trainer.model.state_dict()}


class SpmdTrainer:
    """``trainer``'s per-device program on ``dev``, run by this device itself (see the module doc).

        dev = MPIDevice(cfg.mesh())                    # on every rank of mpiexec -n 8
        local = SpmdTrainer(ParallelTrainer(model, cfg, optimizer), dev)
        for step in range(3):
            loss = local.step(tokens, targets)         # this replica's loss on a last-stage device, else None
        parts = local.fetch()                          # this device's flat vectors; gather, then assemble()

    Every rank calls every method in the same order (they run collectives)."""

    def __init__(self, trainer: Any, dev: Any) -> None:
        cfg = trainer.config
        cfg.check_mesh(dev.mesh)
        self.trainer, self.dev = trainer, dev
        self.spec, _ = trainer._plan()
        self.key = trainer.key + "/spmd"
        dev.state[self.key + "/init"] = rank_init(trainer, self.spec, dev.mesh, dev.rank)
        place(dev, self.key)
        self.steps = 0
        self.last_step_time = 0.0  # how far this device's modelled clock moved in the last step
        self.records: list = []

    def _check(self, tokens: Any, targets: Any) -> tuple[np.ndarray, np.ndarray]:
        model, cfg = self.trainer.model, self.trainer.config
        tokens = model.check_tokens(tokens)
        targets = np.asarray(targets)
        if targets.shape != tokens.shape or targets.dtype.kind not in "iu":
            raise UsageError(f"SpmdTrainer on {getattr(self.dev, 'name', self.dev.rank)}: targets must be "
                             f"integers of the tokens' shape {tokens.shape}, got {targets.dtype} of shape "
                             f"{targets.shape}")
        cfg.check_batch(tokens.shape, model.seq_len)
        return tokens, targets

    def step(self, tokens: Any, targets: Any) -> float | None:
        """One training step on the global batch (every rank passes the same one): this replica's mean
        loss on a device of the last pipeline stage, else None."""
        tokens, targets = self._check(tokens, targets)
        x, y = rank_batch(self.trainer.config, self.spec, self.dev.mesh, self.dev.rank, tokens, targets)
        if x is not None:
            self.dev.state[self.key + "/x"] = x
        if y is not None:
            self.dev.state[self.key + "/y"] = y
        rows = tokens.shape[0] // self.trainer.config.dp
        before = self.dev.clock
        loss, _, self.records = step(self.dev, self.key, rows, self.steps > 0,
                                     self.trainer.stage_flops(tokens.shape[1]), self.steps)
        self.last_step_time = self.dev.clock - before
        self.steps += 1
        return loss

    def fetch(self) -> dict[int, dict[str, np.ndarray]]:
        """This device's stages' whole local flat vectors after the last step (commits it)."""
        return fetch(self.dev, self.key, self.steps > 0)

    def memory(self) -> dict[str, Any]:
        """This device's memory ledger of the last step (:func:`.memory.ledger`)."""
        return ledger(self.dev, self.key)
