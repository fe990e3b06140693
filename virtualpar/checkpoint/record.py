"""What the driver keeps of one training operation between its steps (see :mod:`.recovery`): the
committed head (a version that moves with every commit or load, and the step), the in-memory copy
of the committed state, the slot files that hold each version, the checkpoint settings, and how a
copy of the operation forks all of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from .spill import Spill
from .state import TrainingState

__all__ = ["CommittedHead", "ReadSlots", "RecoveryRecord"]


class CommittedHead(NamedTuple):
    version: int  # moves with every commit and load: a cluster holding another version is stale
    step: int


class ReadSlots:
    """What a slot file held at one version, read: a source :meth:`Recoverable.committed` reads like a
    live :class:`~.spill.Spill`."""

    def __init__(self, version: int, stages: dict[int, tuple[dict, dict]]) -> None:
        self.version, self.stages = version, stages

    def read(self, version: int) -> dict[int, tuple[dict, dict]]:
        return self.stages if version == self.version else {}


class RecoveryRecord:
    """What the driver keeps of one operation (see the module doc)."""

    def __init__(self) -> None:
        self.head = CommittedHead(0, 0)
        self.committed: TrainingState | None = None  # in memory, valid while committed_version is head's
        self.committed_version = -1
        self.sources: dict[int, Spill] = {}  # version -> the slot files holding it (the head's, at least)
        self.last: Any = None  # weakref to the cluster of the last commit
        self.driver_copy = True
        self.every: int | None = None
        self.directory: Path | None = None
        self.note = ""  # how the committed state was recovered, for the resume's line
        self.origin: str | None = None  # where a state loaded for no cluster came from

    def fork(self) -> "RecoveryRecord":
        """For a copy of the operation: the same committed state, no clusters, no checkpoint directory."""
        new = RecoveryRecord()
        new.head = self.head
        new.committed, new.committed_version = self.committed, self.committed_version
        spill = self.sources.get(self.head.version)
        if spill is not None and self.head.version != self.committed_version:
            # read now: the original's next steps rewrite these slots (assembled by the copy when asked)
            new.sources[self.head.version] = ReadSlots(self.head.version, spill.read(self.head.version))
        new.driver_copy = self.driver_copy  # not the checkpoint directory: the two would overwrite each other
        return new

    def __deepcopy__(self, memo: dict) -> "RecoveryRecord":
        return self.fork()

    def __copy__(self) -> "RecoveryRecord":
        return self.fork()
