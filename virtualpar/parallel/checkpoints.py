"""Checkpoints and resume of a ``ParallelTrainer``: its hooks for :class:`~virtualpar.checkpoint.Recoverable`.

    trainer.save(cluster, "ckpt/")        # weights, AdamW state, step: a shard per (stage, tp rank)
    trainer.load(new_cluster, "ckpt/")    # into any dp, tp, pp, cuts, zero stage, sp or cp
    trainer.configure_recovery(checkpoint_every=10, checkpoint_dir="ckpt/")

A device keeps each unit's parameters as one flat vector (its tp shards of the unit's parameters,
concatenated, zero-padded to a multiple of dp under ZeRO) and the optimizer's slots alike, and under
ZeRO only its dp shard of them (:mod:`.layout`, :mod:`.zero`).  The checkpoint machinery sees the
trainer as ``pp·V × tp`` *named stages* (id ``stage·tp + tp rank``), each holding, under the model's
names, its tp piece of every parameter of its units — ``(name, box)`` for a split parameter, the
name alone for a replicated one (written once, by tp rank 0).  So a checkpoint is keyed by the
model's names alone and re-cuts into any layout by key (:mod:`virtualpar.checkpoint.state`):

- devices report raw flat slices (:mod:`.committed`); :meth:`_assemble` concatenates the dp shards
  (ZeRO) of each (stage, tp rank), drops the padding and cuts the vector at the unit's offsets;
- :meth:`_install` does the inverse for the target layout, in the driver: flatten, pad for its dp,
  take each device's dp shard — and sends each device only its own part.

The padding is zero in the parameters and in every optimizer slot (a zero gradient keeps Adam's
moments at zero, and AdamW's decay keeps a zero weight at zero), so dropping it and padding again
for another dp degree is exact.  Cost of a save or a resume: one copy of the state in the driver.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import numpy as np

from ..checkpoint import Recoverable
from ..checkpoint.state import Name, StageState, TrainingState
from ..checkpoint.tiles import cut
from ..ops.placement import without_cluster_state
from .committed import fetch_raw, open_spill, place_state, raw_id
from .layout import flatten, tp_dim

__all__ = ["TrainerCheckpoints"]

_COPIES = itertools.count()


def _dp_shard(a: np.ndarray, dp: int, rank: int) -> np.ndarray:
    """dp rank ``rank``'s equal slice of a padded flat vector (a 0-d slot, Adam's step, is kept whole)."""
    return a if a.ndim == 0 else np.array_split(a, dp)[rank]


class TrainerCheckpoints(Recoverable):
    """The checkpoint hooks of :class:`~virtualpar.parallel.ParallelTrainer` (see the module doc).

    Needs of the trainer: ``model``, ``config``, ``optimizer``, ``units`` (per stage, its
    :class:`~.layout.Unit` list), ``key`` and ``_ensure_placed(cluster)``."""

    _fetch_fn = staticmethod(fetch_raw)
    _spill_fn = staticmethod(open_spill)

    # -- what a checkpoint holds -----------------------------------------------------------------------
    def _stage_names(self) -> dict[int, dict[str, Name]]:
        """Named stage ``s·tp + t`` -> {model name: the model name, or (name, its tp rank t's box)}."""
        full = self.model.state_dict()
        tp = self.config.tp
        out: dict[int, dict[str, Name]] = {}
        for s, units in enumerate(self.units):
            for t in range(tp):
                names: dict[str, Name] = {}
                for u in units:
                    for n in u.names:
                        dim = tp_dim(n)
                        names[n] = n if dim is None or tp == 1 else (n, cut(full[n].shape, dim, tp)[t])
                out[s * tp + t] = names
        return out

    def _model_weights(self) -> dict[str, np.ndarray]:
        """The model's parameters as the trainer keeps them (tied embeddings: the head's weight is the
        embedding's, kept once under ``tok_emb.weight``)."""
        held = {n for units in self.units for u in units for n in u.names}
        return {k: v for k, v in self.model.state_dict().items() if k in held}

    def _shard_name(self, stage: int) -> str:
        tp = self.config.tp
        return f"stage{stage // tp}-tp{stage % tp}"

    def _layout(self) -> dict[str, Any]:
        cfg = self.config
        return {"kind": type(self).__name__, "dp": cfg.dp, "tp": cfg.tp, "pp": cfg.pp, "cp": cfg.cp,
                "zero": cfg.zero, "sequence_parallel": cfg.sequence_parallel, "schedule": cfg.schedule,
                "stages": cfg.stages, "units": [[u.name for u in units] for units in self.units]}

    def committed_state_dict(self) -> dict[str, np.ndarray]:
        """The weights after the last committed step, keyed like ``model.state_dict()``, from the driver
        copy: readable after every device died (``state_dict(cluster)`` asks the devices)."""
        state = self.committed()
        if state is None:
            return super().committed_state_dict()  # raises, saying why
        tp = self.config.tp
        pieces: dict[str, list] = {}
        for s, names in self._stage_names().items():
            for n in names:
                pieces.setdefault(n, [None] * tp)[s % tp] = state.stages[s].params[n]
        out = {n: v[0] if tp_dim(n) is None or tp == 1 else np.concatenate(v, axis=tp_dim(n))
               for n, v in pieces.items()}
        if self.model.tie_embeddings:
            out["head.embedding.weight"] = out["tok_emb.weight"]
        return {k: out[k].copy() for k in self.model.state_dict()}

    # -- devices' raw slices <-> named stages ---------------------------------------------------------
    def _assemble(self, reported: dict[int, StageState]) -> dict[int, StageState]:
        cfg = self.config
        dp = cfg.dp if cfg.zero else 1
        out = {}
        for s, units in enumerate(self.units):
            for t in range(cfg.tp):
                parts = [reported.get(raw_id(s, t, d, cfg.tp, dp)) for d in range(dp)]
                if any(p is None for p in parts):
                    continue
                params: dict[str, np.ndarray] = {}
                slots: dict[str, dict[str, np.ndarray]] = {}
                for u in units:
                    flat = np.concatenate([p.params[u.name] for p in parts])
                    for n, a, b, shape in u.offsets():
                        params[n] = flat[a:b].reshape(shape)
                    kept = parts[0].optimizer["state"].get(u.name, {})
                    for slot, v in kept.items():
                        whole = np.asarray(v) if np.ndim(v) == 0 else \
                            np.concatenate([p.optimizer["state"][u.name][slot] for p in parts])
                        for n, a, b, shape in u.offsets():
                            slots.setdefault(n, {})[slot] = whole if whole.ndim == 0 else \
                                whole[a:b].reshape(shape)
                opt = parts[0].optimizer
                out[s * cfg.tp + t] = StageState(params, {"t": opt["t"], "lr": opt["lr"], "state": slots})
        return out

    def _device_parts(self, cluster: Any, state: TrainingState) -> list[dict[int, tuple[dict, dict]]]:
        """Per device, its stages' flat vectors and optimizer state in this layout, from named stages."""
        cfg, mesh = self.config, cluster.mesh
        dtype = self.model.dtype
        placement = self._ensure_placed(cluster).placement
        flats: dict[tuple[int, int], tuple[dict, dict]] = {}  # (stage, tp rank) -> whole flat vectors
        for s, units in enumerate(self.units):
            for t in range(cfg.tp):
                st = state.stages[s * cfg.tp + t]
                params = {u.name: flatten(u, st.params, dtype) for u in units}
                slots: dict[str, dict[str, np.ndarray]] = {}
                for u in units:
                    kept = st.optimizer["state"].get(u.names[0], {})
                    for slot, v in kept.items():
                        if np.ndim(v) == 0:
                            slots.setdefault(u.name, {})[slot] = np.array(v, copy=True)
                        else:
                            values = {n: st.optimizer["state"][n][slot] for n in u.names}
                            slots.setdefault(u.name, {})[slot] = flatten(u, values, np.asarray(v).dtype)
                flats[(s, t)] = (params, {"t": st.optimizer["t"], "lr": st.optimizer["lr"], "state": slots})
        out = []
        for r in range(mesh.size):  # (each device's part is pickled on its way: no copies needed here)
            at = mesh.index(r)
            mine = {}
            for s in placement.stages_of(at.pp):
                params, opt = flats[(s, at.tp)]
                if cfg.zero and cfg.dp > 1:
                    opt = {**opt, "state": {u: {k: _dp_shard(v, cfg.dp, at.dp) for k, v in d.items()}
                                            for u, d in opt["state"].items()}}
                    if cfg.zero == 3:
                        params = {n: _dp_shard(v, cfg.dp, at.dp) for n, v in params.items()}
                mine[s] = (params, opt)
            out.append(mine)
        return out

    def _install(self, cluster: Any, state: TrainingState) -> None:
        version = self._recovery.head.version
        for r, mine in enumerate(self._device_parts(cluster, state)):
            cluster.put(r, self.key + "/restore", mine)
        cluster.run(place_state, self.key, version)
        self.hold(cluster, version=version)

    # -- a copy is a training run of its own --------------------------------------------------------
    def __copy__(self) -> "TrainerCheckpoints":
        return self._fresh(without_cluster_state(self.__dict__))

    def __deepcopy__(self, memo: dict) -> "TrainerCheckpoints":
        state = without_cluster_state(self.__dict__)
        return self._fresh({k: copy.deepcopy(v, memo) for k, v in state.items()})

    def _fresh(self, state: dict) -> "TrainerCheckpoints":
        """A new key on the devices, no clusters, the committed state (as the pipeline's copies)."""
        new = object.__new__(type(self))
        new.__dict__.update(state, key=f"{self.key.split('/')[0]}/copy{next(_COPIES)}")
        if "_rec" in state:
            new.__dict__["_rec"] = state["_rec"].fork()
        return new
