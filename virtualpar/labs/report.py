"""What a lab check found: named tests with scores, as a person reads them and as a grader does.

A :class:`Report` is a list of :class:`TestResult`; ``to_gradescope()`` gives the one JSON object
Gradescope-style autograders read (``score``, ``max_score``, ``tests``: each with ``name``,
``score``, ``max_score``, ``status`` and ``output``), and ``format()`` the text a student sees.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TestResult", "Report", "PASSED", "FAILED"]

PASSED, FAILED = "passed", "failed"


@dataclass(frozen=True)
class TestResult:
    """One graded test: ``status`` is ``"passed"`` only at full score; ``output`` says why."""

    __test__ = False  # not a pytest test class, whatever its name

    name: str
    score: float
    max_score: float
    output: str = ""

    @property
    def status(self) -> str:
        return PASSED if self.score >= self.max_score else FAILED

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "score": self.score, "max_score": self.max_score, "status": self.status,
                "output": self.output}


@dataclass
class Report:
    """The outcome of checking one student file against one lab."""

    lab: str
    tests: list[TestResult] = field(default_factory=list)
    pictures: list[str] = field(default_factory=list)  # files written beside the report (timelines)
    timeline: str = ""  # the student's run beside the reference run, as text

    def add(self, name: str, passed: bool | float, max_score: float = 1.0, output: str = "") -> TestResult:
        """Record a test; ``passed`` may be a fraction of ``max_score`` for partial credit."""
        score = max_score * float(passed)
        result = TestResult(name, round(score, 6), max_score, output)
        self.tests.append(result)
        return result

    @property
    def score(self) -> float:
        return round(sum(t.score for t in self.tests), 6)

    @property
    def max_score(self) -> float:
        return round(sum(t.max_score for t in self.tests), 6)

    @property
    def passed(self) -> bool:
        return bool(self.tests) and all(t.status == PASSED for t in self.tests)

    def to_gradescope(self) -> dict[str, Any]:
        return {"score": self.score, "max_score": self.max_score, "tests": [t.to_dict() for t in self.tests]}

    def format(self, width: int = 100) -> str:
        """The text a student reads: a line per test, the reasons of the failed ones wrapped to
        ``width``, then the timelines (already drawn to ``width``)."""
        lines = [f"lab {self.lab}: {self.score:g} / {self.max_score:g}"]
        for t in self.tests:
            mark = "PASS" if t.status == PASSED else "FAIL"
            lines.append(f"  {mark}  {t.name}  ({t.score:g}/{t.max_score:g})")
            if t.output and t.status != PASSED:
                for line in t.output.splitlines():
                    indent = " " * (8 + len(line) - len(line.lstrip()))
                    lines += textwrap.wrap(line.strip(), width, initial_indent=indent,
                                           subsequent_indent=indent + "    ", break_on_hyphens=False) or [""]
        if self.timeline:
            lines += ["", self.timeline]
        lines += [f"picture: {p}" for p in self.pictures]
        return "\n".join(lines)
