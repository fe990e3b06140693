"""Schedule diagrams as the papers draw them: the boxes, computed once, for every renderer.

Ranks are rows, time runs along x; each action is a box coloured by its kind (F, B, I, W, and
transfers in a thin lane of their own) and labelled with its microbatch, and with its chunk when a
rank holds several stages (interleaved, ZB-V).  Gaps are bubbles.  A :class:`Diagram` is pure
data — boxes, ranks, makespan, bubble, title — built from

- a :class:`~virtualpar.pipeline.simulate.Simulation` (``Diagram.from_simulation``),
- an executed step's records, per rank ``(action, (start, end))`` on either clock
  (``Diagram.from_records``; :meth:`PipelinedOperation.timeline` returns one inside its text), or
- a strategy run of the unified scheme (``Diagram.from_strategy``),

and drawn by :mod:`.diagram_svg` (self-contained HTML with inline SVG, no dependency) or
:mod:`.diagram_png` (matplotlib, the ``viz`` extra).  The bubble is the idle share of the
ranks × makespan rectangle, from the compute boxes only: 1 − Σ busy / (ranks · makespan), with the
makespan measured from the first compute start to the last compute end.

Drawing costs O(boxes); a diagram refuses more than :data:`MAX_BOXES` boxes (a picture of them
would be unreadable, and the file hundreds of megabytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterable, NamedTuple

from ..errors import UsageError
from .actions import COMPUTE, Action
from .diagram_labels import KIND_NAMES, fmt_time

__all__ = ["Box", "Diagram", "MAX_BOXES", "KIND_NAMES", "fmt_time"]

#: Most boxes a diagram draws (e.g. 64 ranks × 512 microbatches × 3 kinds is 98 304).
MAX_BOXES = 200_000



class Box(NamedTuple):
    """One drawn action: ``kind`` is F, B, I, W or ``comm``; ``microbatch`` its microbatch (batch),
    ``chunk`` which of its rank's stages it belongs to (0 when a rank holds one), ``stage`` the
    model stage, ``text`` the action as printed (``2I5``), ``label`` what the box shows: its
    microbatch, with its chunk when a rank holds several (``5c1``), or ``s2:5`` (stage 2, batch 5)
    in a strategy's picture, where any worker may run any stage."""

    rank: int
    start: float
    end: float
    kind: str
    microbatch: int
    chunk: int
    stage: int
    text: str
    label: str


def _box(rank: int, start: float, end: float, kind: str, mb: int, chunk: int, stage: int, text: str) -> Box:
    label = f"{mb}" if kind == "comm" or chunk < 0 else f"{mb}c{chunk}"
    return Box(rank, start, end, kind, mb, max(chunk, 0), stage, text, label)


@dataclass(frozen=True)
class Diagram:
    """The boxes of one pipeline step and what the title says (see the module doc).  ``unit``:
    ``"s"`` for seconds (an executed step) or ``"unit"`` for model units (costs as given)."""

    boxes: tuple[Box, ...]
    ranks: int
    title: str
    unit: str = "unit"
    chunks: int = 1
    row_name: str = "rank"

    @property
    def label_note(self) -> str:
        """What the labels mean, for the legend."""
        if self.row_name == "worker":
            return "labels: stage:batch (s2:5)"
        return "labels: microbatch" + (" and chunk (5c1)" if self.chunks > 1 else "")

    def __post_init__(self) -> None:
        if len(self.boxes) > MAX_BOXES:
            raise UsageError(f"a diagram of {len(self.boxes)} boxes is more than the {MAX_BOXES} it draws "
                             f"(a picture that large is unreadable and its file hundreds of MB); draw fewer "
                             f"ranks or microbatches")

    # -- what the picture states (each computed once: a renderer reads them per box) --------------
    @cached_property
    def compute(self) -> list[Box]:
        return [b for b in self.boxes if b.kind != "comm"]

    @cached_property
    def t0(self) -> float:
        return min((b.start for b in self.compute), default=0.0)

    @cached_property
    def makespan(self) -> float:
        """From the first compute start to the last compute end."""
        return max((b.end for b in self.compute), default=0.0) - self.t0

    @cached_property
    def busy(self) -> list[float]:
        out = [0.0] * self.ranks
        for b in self.compute:
            out[b.rank] += b.end - b.start
        return out

    @cached_property
    def bubble(self) -> float:
        total = self.ranks * self.makespan
        return 1.0 - sum(self.busy) / total if total else 0.0

    @cached_property
    def kinds(self) -> list[str]:
        """The kinds present, in legend order."""
        present = {b.kind for b in self.boxes}
        return [k for k in (*COMPUTE, "comm") if k in present]

    @property
    def heading(self) -> str:
        return f"{self.title} — makespan {fmt_time(self.makespan, self.unit)}, bubble {self.bubble:.1%}"

    @property
    def note(self) -> str | None:
        """A line under the heading when transfers, not the schedule, make most of the bubble (an
        executed step whose compute is tiny next to its links' latency): say so, or the picture of
        slivers reads as a broken schedule."""
        if self.bubble < 0.5 or not any(b.kind == "comm" for b in self.boxes):
            return None
        return (f"compute fills {1 - self.bubble:.1%} of the {self.row_name}s' time: they mostly wait for "
                f"transfers, so the boxes are thin; the schedule's own shape is its picture at unit costs")

    # -- constructors -----------------------------------------------------------------------------
    @classmethod
    def from_simulation(cls, sim: Any, placement: Any, title: str = "schedule") -> "Diagram":
        """The simulated ``sim`` of a schedule on ``placement``, in the costs' units."""
        chunk_of = _chunks(placement)
        boxes = tuple(_box(r, s, e, a.kind, a.microbatch, chunk_of.get(a.stage, 0), a.stage, str(a))
                      for a, (r, s, e) in sim.times.items())
        return cls(_sorted(boxes), sim.ranks, title, "unit", _count_chunks(placement))

    @classmethod
    def from_records(cls, rows: dict[int, list[tuple[Action, tuple[float, float]]]], placement: Any = None,
                     title: str = "pipeline step", unit: str = "s", transfers: bool = True) -> "Diagram":
        """An executed step: per rank, ``(action, (start, end))``; times shift so the first compute
        starts at 0.  Transfers are drawn in their own lane when ``transfers``."""
        chunk_of = _chunks(placement) if placement is not None else {}
        spans = [s for acts in rows.values() for a, (s, _) in acts if a.is_compute]
        t0 = min(spans, default=0.0)
        boxes = []
        for r, acts in rows.items():
            for a, (s, e) in acts:
                if not a.is_compute and not transfers:
                    continue
                kind = a.kind if a.is_compute else "comm"
                chunk = chunk_of.get(a.stage, 0)
                boxes.append(_box(r, s - t0, e - t0, kind, a.microbatch, chunk, a.stage, str(a)))
        ranks = max(rows, default=-1) + 1
        chunks = _count_chunks(placement) if placement is not None else 1
        return cls(_sorted(tuple(boxes)), ranks, title, unit, chunks)

    @classmethod
    def from_strategy(cls, run: Any, title: str = "strategy") -> "Diagram":
        """A strategy run: each item on its compute worker, F or B, labelled batch and stage."""
        boxes = tuple(Box(i.workers.compute, i.start, i.end, "F" if i.work.direction.value == "f" else "B",
                          i.work.batch, 0, i.work.stage, f"{i.work}:{i.work.batch}",
                          f"s{i.work.stage}:{i.work.batch}") for i in run.items)
        return cls(_sorted(boxes), run.num_workers, title, "unit", 1, "worker")

    # -- renderers (each a thin call into its module) --------------------------------------------
    def to_svg(self) -> str:
        from .diagram_svg import to_svg

        return to_svg(self)

    def to_html(self, path: str | None = None) -> str:
        """A self-contained HTML page with the inline SVG; written to ``path`` when given."""
        from .diagram_svg import to_html

        page = to_html(self)
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(page)
        return page

    def to_png(self, path: str, dpi: int = 120) -> str:
        """A PNG at ``path`` (needs matplotlib: ``pip install virtualpar[viz]``); returns the path."""
        from .diagram_png import to_png

        return to_png(self, path, dpi)


def _chunks(placement: Any) -> dict[int, int]:
    """Stage -> its index among its rank's stages (0 when every rank holds one)."""
    if placement is None:
        return {}
    out: dict[int, int] = {}
    for r in range(placement.ranks):
        for i, s in enumerate(sorted(s for s in range(placement.stages) if placement.stage_rank[s] == r)):
            out[s] = i
    if max(out.values(), default=0) == 0:
        return {s: -1 for s in out}  # one chunk: labels are microbatches alone
    return out


def _count_chunks(placement: Any) -> int:
    return max(1, max(_chunks(placement).values(), default=0) + 1) if placement is not None else 1


def _sorted(boxes: Iterable[Box]) -> tuple[Box, ...]:
    return tuple(sorted(boxes, key=lambda b: (b.rank, b.start, b.kind == "comm")))
