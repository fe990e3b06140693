"""Folding a wide rank × step grid into blocks that fit a terminal (commands/_grid.py)."""

from __future__ import annotations

from virtualpar.commands._grid import fold_grid
from virtualpar.pipeline import Action
from virtualpar.pipeline.validate import format_grid


def test_a_wide_grid_folds_into_blocks_of_whole_cells_and_loses_no_cell():
    grid = {r: [Action(r, "F", m) if (m + r) % 3 else None for m in range(20)] for r in range(2)}
    text = "(model clock)\n" + format_grid(grid)
    assert max(map(len, text.splitlines())) == 7 + 20 * 6 - 1  # 126 columns before folding
    folded = fold_grid(text, width=40)
    lines = folded.splitlines()
    assert lines[0] == "(model clock)" and max(map(len, lines)) <= 40
    blocks = folded.split("\n\n")
    assert len(blocks) == 4  # (40 - 7) // 6 = 5 steps a block
    assert blocks[1].splitlines()[0] == "rank |     5     6     7     8     9"
    for r in range(2):  # each rank's cells, block after block, are its row's cells in order
        row = [line for line in text.splitlines() if line.startswith(f"{r:>4} |")][0]
        pieces = [line.split("|")[1].split() for b in blocks for line in b.splitlines()
                  if line.startswith(f"{r:>4} |")]
        assert sum(pieces, []) == row.split("|")[1].split() and len(pieces) == 4

def test_a_grid_that_fits_is_unchanged():
    text = format_grid({0: [Action(0, "F", 0), None]})
    assert fold_grid(text, width=100) == text
