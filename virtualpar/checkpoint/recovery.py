"""``Recoverable``: save, load and resume for any training operation (pipeline, strategy, timeline, ...).

A training operation commits a step all or nothing: its devices stage the update and the driver
commits it once every device succeeded.  This mixin keeps, per operation, on the driver:

- ``step``: the committed steps, and a version that moves with every commit or load (a cluster
  whose state has another version is stale and gets the committed state placed on it);
- the **driver copy**: every stage's weights and optimizer state after the last committed step,
  written by one device per stage into slot files only the driver can reach once the devices are
  gone (:mod:`.spill`; without them, shipped with the step's replies), read only when needed
  (``driver_copy=True``, the default); its cost per step is measured by ``benchmarks/bench_pipeline.py``;
- optionally a checkpoint every ``checkpoint_every`` steps in ``checkpoint_dir``.

When the operation next runs on a cluster that does not hold its last committed state — a new one
after a device died, a run timed out or the driver was interrupted — it places that state there and
says so in one warning (``resuming pipeline/3 from step 5 (the cluster that held it closed)``), or
falls back to the newest checkpoint (and says which step it redoes), or raises
:class:`ResumeError`: it never starts again from the initial weights silently.

Versions make the commit explicit: the driver passes each run the version the cluster holds
once its last successful step is settled; a device adopts its prepared update only if that update
makes exactly this version, and drops it otherwise (a failed step; a device the failure stopped
before it settled the step before adopts that one late).

An operation provides the hooks: ``key``, ``optimizer``, ``_ensure_placed(cluster)``,
``_stage_names()`` (stage -> {its name: model name}),
``_model_weights()``, ``_shard_name(stage)``, ``_layout()``, and the device functions
``_fetch_fn(dev, key, version)``, ``_place_fn(dev, key, stages, version)`` and
``_spill_fn(dev, key, prefix)``; optionally ``_assemble(reported)``, when what a device reports is
a slice of a stage (ZeRO's dp shards), and ``_install(cluster, state)``, to send each device only
its part.
"""

from __future__ import annotations

import logging
import os
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError, VirtualParError
from ..ops.placement import PlacedOperation
from .spill import Spill
from .state import StageState, TrainingState, from_checkpoint, to_shards
from .record import CommittedHead, RecoveryRecord
from .store import INDEX, Checkpoint, write_checkpoint

__all__ = ["Recoverable", "ResumeError"]

log = logging.getLogger("virtualpar.checkpoint")


class ResumeError(VirtualParError):
    """An operation's committed state cannot be recovered (it never starts again from its initial weights)."""


class Recoverable(PlacedOperation):
    """Base of the training operations: ``save``, ``load``, ``step``, ``committed()`` and the resume.

    Per cluster (the :class:`~virtualpar.ops.placement.PlacedOperation` record) it keeps ``"version"``,
    the committed state that cluster's devices hold, and ``"spill"``, its slot files for the driver
    copy; what the driver keeps of the operation itself (the head, the copy) is ``_recovery``."""

    @property
    def _recovery(self) -> RecoveryRecord:
        rec = self.__dict__.get("_rec")
        if rec is None:
            rec = self.__dict__["_rec"] = RecoveryRecord()
        return rec

    @property
    def step(self) -> int:
        """Steps committed so far (the index of the next step's batch in a deterministic loop)."""
        return self._recovery.head.step

    def configure_recovery(self, *, driver_copy: bool = True, checkpoint_every: int | None = None,
                           checkpoint_dir: str | os.PathLike | None = None) -> "Recoverable":
        """``driver_copy``: keep the last committed step on the driver (default on); ``checkpoint_every=k``
        with ``checkpoint_dir``: also write a checkpoint there every k committed steps.  Returns the
        operation."""
        every = checkpoint_every
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise UsageError(f"checkpoint_every must be an int >= 1 (steps between checkpoints), got "
                             f"{every!r}")
        if (every is None) != (checkpoint_dir is None):
            raise UsageError("checkpoint_every and checkpoint_dir go together: every how many steps, and "
                             f"where (got checkpoint_every={every!r}, checkpoint_dir={checkpoint_dir!r})")
        rec = self._recovery
        rec.driver_copy, rec.every = bool(driver_copy), checkpoint_every
        rec.directory = None if checkpoint_dir is None else Path(checkpoint_dir)
        return self

    def committed(self) -> TrainingState | None:
        """The driver copy: the state after the last committed step (None if not kept)."""
        rec = self._recovery
        if rec.committed is not None and rec.committed_version == rec.head.version:
            return rec.committed
        spill = rec.sources.get(rec.head.version)
        if spill is not None:
            stages = self._assemble({s: StageState(*v) for s, v in spill.read(rec.head.version).items()})
            if set(stages) == set(self._stage_names()):
                self._keep(TrainingState(rec.head.step, stages))
                return rec.committed
        return None

    def _assemble(self, reported: dict[int, StageState]) -> dict[int, StageState]:
        """The stages as :meth:`_stage_names` names them, from what the devices reported (each under an
        id of its own).  As reported, here; a layout whose devices each hold a slice of a stage's state
        (ZeRO's shards of a flat vector) puts the slices together.  Incomplete input gives fewer stages."""
        return reported

    def committed_state_dict(self) -> dict[str, Any]:
        """The weights after the last committed step, keyed by the model's names, from the driver copy:
        readable after every device died (``state_dict(cluster)`` asks the devices)."""
        state = self.committed()
        if state is None:
            raise ResumeError(f"{self.key}: the driver holds no copy of step {self.step} (the driver copy is "
                              "off, or the operation has not run); ask a cluster that holds it: "
                              "op.state_dict(cluster)")
        names = self._stage_names()
        out = {names[s][k]: v for s, st in state.stages.items() for k, v in st.params.items()
               if isinstance(names[s][k], str)}  # (a layout holding parts of tensors assembles them itself)
        return {k: out[k] for k in self._model_weights() if k in out}

    def _keep(self, state: TrainingState) -> None:
        rec = self._recovery
        rec.committed, rec.committed_version = state, rec.head.version

    # -- checkpoints --------------------------------------------------------------------------------
    def save(self, cluster: Any, path: str | os.PathLike) -> Path:
        """Write the operation's last committed state to the checkpoint directory ``path`` (one shard
        file per stage, see :mod:`virtualpar.checkpoint.store`): fetched from ``cluster``'s devices, or
        the driver copy when ``cluster`` is None or closed."""
        rec = self._recovery
        if cluster is not None and not cluster.closed:
            if self._held(cluster) is None:
                raise UsageError(f"{type(self).__name__} {self.key!r} has not run on this cluster, so it "
                                 "holds none of its state; run a step first, or save(None, path) for the "
                                 "driver's copy")
            state = self._fetch(cluster) if self._held(cluster) == rec.head.version else self.committed()
        else:
            state = self.committed()
        if state is None and rec.head.step == 0:
            raise UsageError(f"{self.key} has not run: nothing to save yet; run a step first: "
                             "cluster.execute(op, ...)")
        if state is None:
            raise ResumeError(f"{self.key}: no copy of step {rec.head.step} is left to save (the cluster is "
                              "closed and the driver copy is off)")
        return self._write(path, state)

    def load(self, cluster: Any, path: str | os.PathLike) -> int:
        """Make the checkpoint at ``path`` (saved under any layout of the same model) the operation's
        committed state and place it on ``cluster`` (None: on the next cluster it runs on); returns its
        step."""
        ckpt = Checkpoint(path)
        state = from_checkpoint(ckpt, self._stage_names(), self._model_weights(), self.optimizer)
        rec = self._recovery
        rec.head = CommittedHead(rec.head.version + 1, state.step)
        self._keep(state)
        rec.origin = f"loaded from {path}"
        if cluster is not None:
            self._ensure_placed(cluster)
            self._adopt(cluster)
            self._install(cluster, state)
        log.info("%s loaded step %d from %s", self.key, state.step, path)
        return state.step

    # -- what the operations' execute_on calls -------------------------------------------------------
    def _resume(self, cluster: Any) -> None:
        """Before a step on ``cluster`` (placed): the last committed state placed there if it lacks it."""
        rec = self._recovery
        if self._adopt(cluster) == rec.head.version:
            return
        last = rec.last() if rec.last is not None else None
        why = rec.origin or ("the cluster that held it closed" if last is None or last.closed
                             else "it moves from another cluster")
        state = self.committed() or self._from_directory(rec)
        if state is None:
            raise ResumeError(f"{self.key} committed {rec.head.step} steps and {why}, but no copy of them is "
                              "left (the driver copy is off and no checkpoint was written); load one with "
                              "op.load(cluster, path), or build a new operation to start from the model's "
                              "weights")
        log.warning("resuming %s from step %d (%s%s)", self.key, state.step, why, rec.note)
        rec.note = ""
        self._install(cluster, state)

    def _adopt(self, cluster: Any) -> int:
        """The state version ``cluster`` holds; a cluster new to the operation (placed from the model's
        weights: version 0) gets its slot files for the driver copy first."""
        if self._held(cluster) is None:
            if self._recovery.driver_copy:
                self._open_spill(cluster)
            self.hold(cluster, version=0)
        return self._held(cluster)

    def _held(self, cluster: Any) -> int | None:
        """The committed state version ``cluster``'s devices hold (None: this operation never ran there)."""
        return (self.state_for(cluster) or {}).get("version")

    def _held_current(self, cluster: Any) -> int | None:
        """:meth:`_held`, refusing a cluster that holds an older state than the committed one (the
        operation went on on another cluster, or loaded a checkpoint): its weights would be stale."""
        held, rec = self._held(cluster), self._recovery
        if held is not None and held != rec.head.version:
            raise UsageError(f"{self.key}: this cluster holds an older state than the {rec.head.step} steps "
                             "committed since (the operation went on on another cluster, or loaded a "
                             "checkpoint); run a step on it, which places the committed state first, or "
                             "read op.committed_state_dict()")
        return held

    def _failed(self, cluster: Any) -> None:
        """A step failed.  If it took the cluster down and the driver holds no copy of the last committed
        step, fall back to the newest checkpoint now, so that ``step`` already says where training goes on."""
        if cluster.closed and self.committed() is None:
            self._from_directory(self._recovery)

    def _from_directory(self, rec: RecoveryRecord) -> TrainingState | None:
        """The newest checkpoint in ``checkpoint_dir`` as the committed state (None if there is none)."""
        if rec.directory is None or not (rec.directory / INDEX).exists():
            return None
        ckpt = Checkpoint(rec.directory)
        state = from_checkpoint(ckpt, self._stage_names(), self._model_weights(), self.optimizer)
        redo = rec.head.step - state.step
        rec.note = f"; checkpoint {rec.directory}" + (f", {redo} committed steps are redone" if redo else "")
        rec.head = CommittedHead(rec.head.version + 1, state.step)
        self._keep(state)
        return state

    def _open_spill(self, cluster: Any) -> None:
        """Slot files for the driver copy on a new cluster; without them the copy goes with the replies."""
        try:
            spill = Spill(cluster.size)
        except OSError as exc:
            log.info("%s: no slot files for the driver copy (%s); it goes with the replies", self.key, exc)
            return
        try:
            cluster.run(self._spill_fn, self.key, spill.prefix)
        finally:
            spill.unlink()  # every device opened its files, or failed: no name outlives this call
        self.hold(cluster, spill=spill)

    def _install(self, cluster: Any, state: TrainingState) -> None:
        version = self._recovery.head.version
        cluster.run(self._place_fn, self.key, state.stages, version)
        self.hold(cluster, version=version)

    def _commit(self, cluster: Any, snapshots: list[Any]) -> None:
        """After a step that succeeded on every device: one more committed step; ``snapshots``: each
        device's reported stages {stage: (params, optimizer state)} (empty without the driver copy)."""
        rec = self._recovery
        head = CommittedHead(rec.head.version + 1, rec.head.step + 1)
        self.hold(cluster, version=head.version)  # first: interrupted below, the cluster is stale, not ahead
        merged: dict[int, StageState] = {}
        for snap in snapshots:
            for s, (params, opt) in (snap or {}).items():
                merged.setdefault(s, StageState(params, opt))
        spill = (self.state_for(cluster) or {}).get("spill")
        if rec.driver_copy and spill is not None:
            rec.sources[head.version] = spill
        elif rec.driver_copy and merged:
            stages = self._assemble(merged)
            if set(stages) == set(self._stage_names()):
                rec.committed, rec.committed_version = TrainingState(head.step, stages), head.version
        rec.head = head  # the commit: one assignment (an interrupt leaves the old head or the new one)
        for v in [v for v in rec.sources if v < head.version]:
            del rec.sources[v]
        rec.last, rec.origin = weakref.ref(cluster), None
        if rec.every is not None and head.step % rec.every == 0:
            self._write(rec.directory, self.committed() or self._fetch(cluster))

    def _write(self, path: str | os.PathLike, state: TrainingState) -> Path:
        shapes = {k: np.shape(v) for k, v in self._model_weights().items()}
        shards, meta = to_shards(state, self._stage_names(), self._shard_name, self.optimizer, shapes)
        return write_checkpoint(path, shards, step=state.step, layout=self._layout(), meta=meta)

    def _fetch(self, cluster: Any) -> TrainingState:
        parts = cluster.run(self._fetch_fn, self.key, self._held(cluster))
        stages: dict[int, StageState] = {}
        for part in parts:
            for s, (params, opt) in part.items():
                stages.setdefault(s, StageState(params, opt))
        return TrainingState(self._recovery.head.step, self._assemble(stages))
