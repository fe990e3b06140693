"""Checkpoints and recovery of training operations: sharded ``.npz`` files plus a JSON index.

    op.save(cluster, "ckpt/")          # weights, optimizer state and step, one file per stage
    op.load(new_cluster, "ckpt/")      # any layout of the same model: re-cut by key
    op.configure_recovery(checkpoint_every=10, checkpoint_dir="ckpt/")

The format (:mod:`.store`) knows only named arrays per shard, each a box of a full tensor
(:mod:`.tiles`), and JSON metadata; :mod:`.state` maps a training operation's per-stage state to
model-keyed tensors and back; :class:`Recoverable` (:mod:`.recovery`) gives any operation that
provides its hooks ``save``, ``load``, ``step`` and the resume on a new cluster after a fault.
"""

from __future__ import annotations

from .recovery import Recoverable, ResumeError
from .state import Name, StageState, TrainingState, from_checkpoint, to_shards
from .store import INDEX, Checkpoint, CheckpointError, write_checkpoint
from .tiles import Piece, TileError, assemble, cut, piece_along

__all__ = ["Checkpoint", "CheckpointError", "INDEX", "Name", "Piece", "Recoverable", "ResumeError",
           "StageState",
           "TileError", "TrainingState", "assemble", "cut", "from_checkpoint", "piece_along", "to_shards",
           "write_checkpoint"]
