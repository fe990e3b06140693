"""Schedule diagrams: the box list derived from a simulation (counts, gaps = bubble, closed forms),
the SVG/HTML (parses, legend, self-contained) and the PNG (written, valid, differs between schedules)."""

from __future__ import annotations

import html
import xml.etree.ElementTree as ET

import pytest

from virtualpar.pipeline import build, simulate
from virtualpar.pipeline.diagram import Box, Diagram
from virtualpar.pipeline.schedules import zb_h1_makespan

SPLIT = {"F": 1, "I": 1, "W": 1}
WHOLE = {"F": 1, "B": 2}


def _diagram(name: str, R: int, M: int, costs: dict, virtual: int | None = None) -> Diagram:
    sched, placement = build(name, R, M, virtual)
    return Diagram.from_simulation(simulate(sched, placement, M, costs=costs), placement,
                                   f"{name} R={R} M={M}")


@pytest.mark.parametrize("name, costs, kinds",
                         [("1f1b", WHOLE, "FB"), ("zb_h1", SPLIT, "FIW"), ("gpipe", WHOLE, "FB")])
@pytest.mark.parametrize("R, M", [(1, 1), (2, 3), (4, 8), (5, 3)])
def test_boxes_per_kind_per_rank_and_the_bubble(name, costs, kinds, R, M):
    d = _diagram(name, R, M, costs)
    for r in range(R):
        for k in kinds:
            assert sum(1 for b in d.boxes if b.rank == r and b.kind == k) == M
    # the gaps are the bubble: idle area / (ranks x makespan), from the boxes alone
    idle = R * d.makespan - sum(b.end - b.start for b in d.boxes)
    assert d.bubble == pytest.approx(idle / (R * d.makespan), abs=1e-12)
    # boxes of one rank never overlap
    for r in range(R):
        row = sorted((b.start, b.end) for b in d.boxes if b.rank == r)
        assert all(e0 <= s1 for (_, e0), (s1, _) in zip(row, row[1:]))


def test_box_list_states_the_closed_forms():
    d = _diagram("zb_h1", 4, 8, SPLIT)
    assert d.makespan == zb_h1_makespan(4, 8, 1, 1, 1) == 27
    assert d.bubble == pytest.approx(3 / 27)
    one = _diagram("1f1b", 4, 8, WHOLE)
    assert one.makespan == 33 and one.bubble == pytest.approx(9 / 33)
    assert "makespan 27, bubble 11.1%" in d.heading


def test_chunks_label_interleaved_and_v_boxes():
    v = _diagram("zbv", 2, 4, SPLIT)
    assert v.chunks == 2
    rank0 = {(b.stage, b.chunk) for b in v.boxes if b.rank == 0}
    assert rank0 == {(0, 0), (3, 1)}  # the V: rank 0 holds the first and the last stage
    assert {b.label for b in v.boxes if b.rank == 0 and b.stage == 3 and b.kind == "F"} == {
        f"{m}c1" for m in range(4)
    }
    one = _diagram("1f1b", 2, 2, WHOLE)
    assert one.chunks == 1 and {b.label for b in one.boxes} == {"0", "1"}


def test_a_diagram_refuses_more_boxes_than_it_can_draw():
    from virtualpar.errors import UsageError
    from virtualpar.pipeline.diagram import MAX_BOXES

    boxes = (Box(0, 0.0, 1.0, "F", 0, 0, 0, "0F0", "0"),) * (MAX_BOXES + 1)
    with pytest.raises(UsageError, match=f"more than the {MAX_BOXES} it draws"):
        Diagram(boxes, 1, "too many")


def _svg(d: Diagram) -> ET.Element:
    page = d.to_html()
    assert page.startswith("<!DOCTYPE html>") and "http" not in page.replace("http://www.w3.org/2000/svg", "")
    start, end = page.index("<svg"), page.index("</svg>") + len("</svg>")
    return ET.fromstring(page[start:end])


def test_html_is_self_contained_svg_with_a_legend_and_the_title(tmp_path):
    d = _diagram("zb_h1", 4, 8, SPLIT)
    root = _svg(d)
    ns = "{http://www.w3.org/2000/svg}"
    texts = [t.text for t in root.iter(f"{ns}text")]
    assert any("makespan 27, bubble 11.1%" in (t or "") for t in texts)
    legend = [g for g in root.iter(f"{ns}g") if g.get("class") == "legend"]
    assert legend and {"F forward", "I backward (input)", "W backward (weights)"} <= \
        {t.text for t in legend[0].iter(f"{ns}text")}
    boxes = [r for r in root.iter(f"{ns}rect") if r.find(f"{ns}title") is not None]
    assert len(boxes) == 3 * 4 * 8
    path = tmp_path / "d.html"
    d.to_html(str(path))
    assert path.read_text(encoding="utf-8") == d.to_html()


def test_two_schedules_give_different_svgs_and_pngs(tmp_path):
    mpimg = pytest.importorskip("matplotlib.image")
    a, b = _diagram("1f1b", 4, 8, {"F": 1, "B": 2}), _diagram("zb_h1", 4, 8, SPLIT)
    assert a.to_svg() != b.to_svg()
    pa, pb = tmp_path / "a.png", tmp_path / "b.png"
    a.to_png(str(pa))
    b.to_png(str(pb))
    ia, ib = mpimg.imread(str(pa)), mpimg.imread(str(pb))
    assert ia.ndim == 3 and ia.shape[0] > 100 and ia.shape[1] > 1000
    assert ia.shape != ib.shape or (abs(ia - ib) > 0.1).any()
    # the same makespan but a different order still draws differently (labels and colours)
    c = _diagram("zb_h1", 4, 8, {"F": 1, "I": 2, "W": 1})
    pc = tmp_path / "c.png"
    c.to_png(str(pc))
    ic = mpimg.imread(str(pc))
    assert ic.shape != ib.shape or (abs(ic - ib) > 0.1).any()


def test_a_missing_matplotlib_names_the_extra(monkeypatch, tmp_path):
    import builtins

    real = builtins.__import__

    def no_matplotlib(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(ImportError, match=r"pip install virtualpar\[viz\]"):
        _diagram("1f1b", 2, 2, WHOLE).to_png(str(tmp_path / "x.png"))


def test_strategy_diagram_rows_are_workers():
    from virtualpar.strategies import GPipe
    from virtualpar.strategies import simulate as run

    d = Diagram.from_strategy(run(4, 4, 8, GPipe), "gpipe")
    assert d.row_name == "worker" and d.makespan == 33
    assert sum(1 for b in d.boxes if b.kind == "F") == sum(1 for b in d.boxes if b.kind == "B") == 32
    assert "worker 3" in d.to_svg() and "s2:5" in {b.label for b in d.boxes}


def test_a_step_that_mostly_waits_for_transfers_says_so_under_its_heading():
    """On h100-node the demo's compute is ~5% of the step: thin boxes read as a broken schedule unless
    the picture says why; a schedule's own diagram (no transfers) carries no such note."""
    from virtualpar.pipeline import Action

    rows = {0: [(Action(0, "F", 0), (0.0, 1.0)), (Action(0, "SF", 0), (1.0, 1.0)),
                (Action(0, "RB", 0), (1.0, 19.0)), (Action(0, "B", 0), (19.0, 20.0))],
            1: [(Action(1, "RF", 0), (0.0, 10.0)), (Action(1, "F", 0), (10.0, 11.0)),
                (Action(1, "B", 0), (11.0, 12.0)), (Action(1, "SB", 0), (12.0, 12.0))]}
    d = Diagram.from_records(rows, title="step")
    assert d.bubble == pytest.approx(1 - 4 / 40)
    assert d.note.startswith("compute fills 10.0% of the ranks' time")
    assert html.escape(d.note) in d.to_html()
    assert _diagram("1f1b", 4, 8, WHOLE).note is None
    assert Diagram.from_records(rows, title="step", transfers=False).note is None
