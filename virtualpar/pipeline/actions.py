"""``Action``: one unit of a pipeline schedule, and its compact printable form.

``Action(stage=2, kind="B", microbatch=1)`` prints as ``2B1`` and ``Action.from_str("2B1")`` is its
exact inverse.  Compute kinds: ``F`` (forward), ``B`` (full backward), ``I`` (backward to the input
only) and ``W`` (backward to the weights only) — I and W together are B, as zero-bubble schedules
split it (Qi et al., "Zero Bubble Pipeline Parallelism", 2023).  The lowering pass adds transfer
kinds: ``SF``/``RF`` send/receive an activation to/from the next stage, ``SB``/``RB`` a gradient
to/from the previous one; ``SW``/``RW`` a stage's weights from the rank that stores them to the
rank that computes, ``SG``/``RG`` the gradient back; ``2SF1`` is stage 2 sending microbatch 1's
activation onward.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..errors import UsageError

__all__ = ["Action", "ActionRecord", "COMPUTE", "TRANSFER", "KINDS", "Schedule"]

COMPUTE = ("F", "B", "I", "W")
TRANSFER = ("SF", "RF", "SB", "RB", "SW", "RW", "SG", "RG")
KINDS = COMPUTE + TRANSFER
_PATTERN = re.compile(r"^(\d+)(SF|RF|SB|RB|SW|RW|SG|RG|F|B|I|W)(\d+)$")


class Action(NamedTuple):
    """One unit of a schedule: ``kind`` (F, B, I, W or a transfer kind, see the module doc) of microbatch
    ``microbatch`` at stage ``stage``; ``str()`` gives ``2B1``, ``Action.from_str`` reads it back."""

    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def from_str(cls, text: str) -> "Action":
        if not isinstance(text, str):
            raise UsageError(
                f"Action.from_str takes a string such as '2B1', got {type(text).__name__} {text!r}"
            )
        m = _PATTERN.match(text.strip())
        if m is None:
            raise UsageError(f"not an action: {text!r}; expected <stage><kind><microbatch> such as '2B1' "
                             f"with kind one of {', '.join(KINDS)}")
        return cls(int(m.group(1)), m.group(2), int(m.group(3)))

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE


class ActionRecord(NamedTuple):
    """One action as a device ran it: the :class:`Action` itself (it crosses from the device to the
    driver as this record, never as text to parse) and its span on the wall and modelled clocks.
    Unpacks as ``action, wall_start, wall_end, model_start, model_end``."""

    action: Action
    wall_start: float
    wall_end: float
    model_start: float
    model_end: float


#: A schedule: for each pipeline rank, the actions it runs in order (``None`` marks an idle step
#: in a time-aligned grid).  Builders return these; the validator, the simulator and the executor
#: all take them.
Schedule = dict[int, list["Action | None"]]
