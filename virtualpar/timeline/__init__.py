"""Timeline parallelism: a recurrent model's sequence split along time across a mesh axis."""

from __future__ import annotations

from .run import TimelineParallel
from .sequence_pipe import SequencePipe, reference_step

__all__ = ["SequencePipe", "TimelineParallel", "reference_step"]
