"""The text grids of pipeline schedules and executed steps fit the width and name every action."""

from __future__ import annotations

import re

import pytest

from virtualpar.pipeline import Action, build, format_grid, simulate
from virtualpar.pipeline.timeline_grid import format_timeline

LABEL = re.compile(r"\b\d+[FBIW]\d+\b")


def _sim(name: str, S: int, M: int, costs: dict[str, float]):
    sched, placement = build(name, S, M)
    return simulate(sched, placement, M, costs=costs)


@pytest.mark.parametrize("line_width", [40, 80, 100])
def test_a_wide_grid_folds_into_blocks_of_whole_steps(line_width):
    sim = _sim("1f1b", 4, 8, {"F": 1, "B": 2})
    grid = sim.grid()
    text = format_grid(grid, line_width=line_width)
    assert max(len(line) for line in text.splitlines()) <= line_width
    # every cell of every rank appears, in order: the blocks read back to the grid
    cells: dict[int, list[str]] = {r: [] for r in grid}
    steps: list[int] = []
    for line in text.splitlines():
        head, bar, body = line.partition(" | ")
        if head == "rank":
            steps += [int(v) for v in body.split()]
        elif bar:
            cells[int(head)] += body.split()
    assert steps == list(range(33))
    assert cells == {r: [str(a) if a else "." for a in row] for r, row in grid.items()}


def test_the_error_mark_is_on_the_block_holding_the_step():
    sim = _sim("gpipe", 2, 30, {"F": 1, "B": 1})
    grid = sim.grid()
    text = format_grid(grid, mark=(1, 40), line_width=60)
    marked = [line for line in text.splitlines() if "ERROR HERE" in line]
    assert len(marked) == 1 and f"(step 40: {grid[1][40]})" in marked[0]
    block = text.split("\n\n")[[i for i, b in enumerate(text.split("\n\n")) if "ERROR" in b][0]]
    assert " 40" in block.splitlines()[0]


def _rows(sim) -> dict[int, list[tuple[Action, tuple[float, float]]]]:
    rows: dict[int, list[tuple[Action, tuple[float, float]]]] = {r: [] for r in range(sim.ranks)}
    for a, (r, s, e) in sorted(sim.times.items(), key=lambda kv: kv[1][1]):
        rows[r].append((a, (s, e)))
    return rows


def test_an_executed_step_on_equal_cells_is_the_folded_step_grid():
    sim = _sim("1f1b", 4, 8, {"F": 1, "B": 2})
    assert format_timeline(_rows(sim), width=100) == format_grid(sim.grid(), line_width=100)


@pytest.mark.parametrize("width", [60, 100])
def test_an_executed_step_off_cells_is_on_a_time_axis_naming_every_action_once(width):
    """Costs of no common cell (and a W of no time): time along x, scaled to the width; what is too
    short for its label is named below the grid, so every action's label appears exactly once."""
    sim = _sim("zb_h1", 4, 8, {"F": 1.0, "I": 1.37, "W": 0.0})
    rows = _rows(sim)
    text = format_timeline(rows, width=width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    assert sorted(LABEL.findall(text)) == sorted(str(a) for a in sim.times)
    assert "1 column = " in text and "rank |" not in text  # not the step grid
    grid_rows = [line for line in lines if re.match(r"^ +\d+ \|", line)]
    assert len(grid_rows) == 4 and len({len(line) for line in grid_rows}) == 1


def test_long_actions_carry_their_label_at_their_time():
    t = 1.2345  # no common cell: a time axis of 40 columns of 3/40 each
    rows = {0: [(Action(0, "F", 0), (0.0, 1.0)), (Action(0, "B", 0), (t, 3.0))],
            1: [(Action(1, "F", 0), (1.0, t)), (Action(1, "B", 0), (t, t + 0.01))]}
    text = format_timeline(rows, width=47)
    r0, r1 = text.splitlines()[:2]
    assert r0.startswith("   0 |0F0---") and r0[6 + round(t / 3 * 40):].startswith("0B0---")
    assert r1[6 + round(1.0 / 3 * 40):].startswith("F-") and text.splitlines()[-1] == "   1: 1F0 1B0"


def test_a_clock_in_cost_units_says_so_on_its_axis():
    rows = {0: [(Action(0, "F", 0), (0.0, 1.0)), (Action(0, "W", 0), (1.0, 1.0))]}
    text = format_timeline(rows, unit="unit")
    axis = text.splitlines()[2]
    assert (
        "1 column = " in text
        and " unit;" in text
        and axis.split() == ["0", *(f"0.{k}" for k in range(1, 10)), "1"]
    )
