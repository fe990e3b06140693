"""House style that a reader sees first: no line of Python longer than 110 characters.

Counted in characters (not bytes: ``α``, ``→`` and ``σ²`` are one column each), over every ``.py`` file
under ``virtualpar/``, ``tests/`` and ``benchmarks/``.  A failure names each offending ``file:line``.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 110
TREES = ("virtualpar", "tests", "benchmarks")


def long_lines(root: Path = ROOT, limit: int = LIMIT) -> list[str]:
    """``path:line (n chars)`` for every line over ``limit`` characters in the trees above."""
    found = []
    for tree in TREES:
        for path in sorted((root / tree).rglob("*.py")):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if len(line) > limit:
                    found.append(f"{path.relative_to(root)}:{number} ({len(line)} chars)")
    return found


def test_no_line_is_longer_than_110_characters():
    found = long_lines()
    assert not found, f"{len(found)} lines over {LIMIT} characters:\n" + "\n".join(found)


def test_the_check_sees_a_long_line_and_counts_characters_not_bytes(tmp_path):
    (tmp_path / "virtualpar").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "benchmarks" / "sub").mkdir(parents=True)
    (tmp_path / "virtualpar" / "ok.py").write_text("x = '" + "α" * 104 + "'\n", encoding="utf-8")  # 110 chars
    (tmp_path / "benchmarks" / "sub" / "long.py").write_text("\n" + "y" * 111 + "\n", encoding="utf-8")
    assert long_lines(tmp_path) == ["benchmarks/sub/long.py:2 (111 chars)"]
