"""A lab: a folder with a skeleton, a background page, a reference solution and a checker.

A lab is registered as a :class:`Lab` value.  Its folder holds ``skeleton.py`` (what ``lab start``
writes for the student: the function(s) to write, the task, the rules, TODOs and hints),
``LAB.md`` (the background: the algorithm's idea, a picture, the closed form to aim for) and
``reference.py`` (a solution that passes, kept out of the skeleton).  ``check(path, options)``
grades a student's file and returns a :class:`~virtualpar.labs.report.Report`.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import UsageError
from .report import Report

__all__ = ["Lab", "CheckOptions", "DIFFICULTIES"]

DIFFICULTIES = ("intro", "intermediate", "advanced")


@dataclass(frozen=True)
class CheckOptions:
    """How a check runs: ``png``: a directory for the timeline pictures (None: none drawn);
    ``width``: columns of the text timeline; ``quick``: fewer hidden cases (for tests)."""

    png: str | None = None
    width: int = 100
    quick: bool = False


@dataclass(frozen=True)
class Lab:
    """One lab.  ``functions``: what the student writes; ``check``: the grader."""

    name: str
    goal: str
    concept: str
    difficulty: str
    folder: Path
    functions: tuple[str, ...]
    check_fn: Callable[[str, CheckOptions], Report] = field(repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.difficulty not in DIFFICULTIES:
            raise UsageError(f"lab {self.name!r}: difficulty must be one of {DIFFICULTIES}, "
                             f"got {self.difficulty!r}")
        for part in ("skeleton.py", "LAB.md", "reference.py"):
            if not (Path(self.folder) / part).is_file():
                raise UsageError(f"lab {self.name!r}: its folder {self.folder} has no {part}")

    @property
    def skeleton(self) -> Path:
        return Path(self.folder) / "skeleton.py"

    @property
    def background(self) -> Path:
        return Path(self.folder) / "LAB.md"

    @property
    def reference(self) -> Path:
        return Path(self.folder) / "reference.py"

    @property
    def student_file(self) -> str:
        """The name ``lab start`` gives the student's copy of the skeleton."""
        return f"{self.name.replace('-', '_')}.py"

    def start(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Write the skeleton and ``LAB.md`` into ``directory``; never overwrite a student's work."""
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        pairs = [(self.skeleton, target / self.student_file), (self.background, target / "LAB.md")]
        existing = [str(dst) for _, dst in pairs if dst.exists()]
        if existing:
            raise UsageError(f"lab start {self.name}: {', '.join(existing)} already exist(s); "
                             f"remove it or choose another directory")
        for src, dst in pairs:
            shutil.copyfile(src, dst)
        return [dst for _, dst in pairs]

    def check(self, path: str | os.PathLike[str], options: CheckOptions | None = None) -> Report:
        return self.check_fn(os.fspath(path), options or CheckOptions())
