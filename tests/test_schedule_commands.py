"""The schedule, pipeline and strategy commands: the schedule passed the same way, costs refused
for kinds never run, --unit-costs all ones, --json with the costs used, pictures written, usage
errors exit 2, huge sizes refused at once; messages that name the cause."""

from __future__ import annotations

import json
import time

import pytest

from virtualpar.cli import main


def _run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_schedule_json_reports_the_costs_it_used(capsys):
    code, out, _ = _run(["schedule", "zb_h1", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["costs"] == {"F": 1.0, "I": 1.0, "W": 1.0} and doc["makespan"] == 27
    code, out, _ = _run(["schedule", "1f1b", "--json", "--costs", "B=3"], capsys)
    doc = json.loads(out)
    assert doc["costs"] == {"F": 1.0, "B": 3.0} and doc["makespan"] == 8 * 4 + 3 * 4


def test_unit_costs_means_every_kind_costs_one(capsys):
    code, out, _ = _run(["schedule", "1f1b", "--unit-costs", "--json"], capsys)
    doc = json.loads(out)
    assert doc["costs"] == {"F": 1.0, "B": 1.0} and doc["makespan"] == 2 * (8 + 3)


@pytest.mark.parametrize("argv, said", [
    (["schedule", "zb_h1", "--costs", "F=1,B=2,W=1"], "--costs gives B, which zb_h1 never runs"),
    (["schedule", "1f1b", "--costs", "I=1"], "--costs gives I, which 1f1b never runs"),
    (["schedule", "zbv", "--costs", "F=1", "--unit-costs"], "give it or --costs, not both"),
    (["pipeline", "zb_h1", "--costs", "B=2"], "--costs gives B, which zb_h1 never runs"),
    (["pipeline", "1f1b", "--schedule", "gpipe"], "the schedule is given twice"),
    (["pipeline", "nope"], "unknown schedule 'nope'"),
    (["pipeline", "interleaved_1f1b", "--stages", "2", "--microbatches", "3", "--batch", "6"],
     "microbatches must be a multiple of 2"),
    (["pipeline", "--microbatches", "6"], "give a batch that is a multiple of 6"),
    (["pipeline", "zbv", "--stages", "4"], "the MLP has 7 layers to cut; use at most 3 devices"),
    (["strategy", "gpipe", "--costs", "W=1"], "--costs gives W, which the strategy gpipe never runs"),
    (["strategy", "gpipe", "--workers", "2"], "needs at least as many workers as stages"),
    (["tour", "--hardware", "dgx"],
     "invalid choice: 'dgx' (choose from 'laptop', 'h100-node', 'h100-cluster')"),
    (["pipeline", "--hardware", "dgx"], "invalid choice: 'dgx'"),
    (["schedule", "zb_h1", "--png", "x.svg"], "is not a .png file name"),
])
def test_usage_errors_exit_2_and_say_why(argv, said, capsys):
    code, _, err = _run(argv, capsys)
    assert code == 2, err
    assert said in err, err


def test_the_old_schedule_flag_still_works_and_matches_the_positional(capsys):
    from virtualpar.cli import build_parser

    a = build_parser().parse_args(["pipeline", "--schedule", "zb_h1"])
    b = build_parser().parse_args(["pipeline", "zb_h1"])
    assert (a.schedule, a.name, b.name) == ("zb_h1", None, "zb_h1")
    helptext = build_parser()._subparsers._group_actions[0].choices["pipeline"].format_help()
    assert "--schedule" not in helptext and "NAME" in helptext and "h100-cluster" in helptext


@pytest.mark.parametrize("argv, said", [
    (["schedule", "1f1b", "--stages", "10000"], "--stages 10000: at most 512 pipeline ranks"),
    (["schedule", "1f1b", "--microbatches", "1000000"], "--microbatches 1000000: at most 4096"),
    (["schedule", "zb_h1", "--stages", "512", "--microbatches", "4096"], "at most 262,144"),
    (["strategy", "gpipe", "--stages", "100000", "--workers", "100000"], "--workers 100000: at most 512"),
    (["strategy", "ddp", "--stages", "400", "--batches", "1000"], "work items"),
])
def test_huge_sizes_are_refused_at_once_with_the_limit(argv, said, capsys):
    t0 = time.process_time()
    code, _, err = _run(argv, capsys)
    assert code == 2 and said in err, err
    assert time.process_time() - t0 < 5  # refused before building: 10000 stages took 151 s and 6 GB


def test_a_large_schedule_prints_its_summary_without_the_grid(capsys):
    code, out, _ = _run(["schedule", "1f1b", "--stages", "128", "--microbatches", "512"], capsys)
    assert code == 0 and "grid omitted: 128 ranks" in out and "makespan 1917" in out
    assert max(len(line) for line in out.splitlines()[:2]) < 200


def test_schedule_and_strategy_write_their_pictures(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    import matplotlib.image as mpimg

    for argv in (["schedule", "zbv"], ["schedule", "1f1b"], ["strategy", "gpipe"]):
        png, page = tmp_path / f"{argv[1]}-{argv[0]}.png", tmp_path / f"{argv[1]}-{argv[0]}.html"
        code, out, _ = _run(argv + ["--png", str(png), "--html", str(page)], capsys)
        assert code == 0 and f"diagram: {png}" in out
        assert mpimg.imread(str(png)).shape[1] > 1000
        assert "<svg" in page.read_text() and "makespan" in page.read_text()
    code, out, err = _run(["schedule", "zb_h1", "--json", "--html", str(tmp_path / "j.html")], capsys)
    assert json.loads(out)["makespan"] == 27 and "diagram:" in err  # stdout stays one JSON object


def test_pipeline_command_draws_the_executed_step_on_the_unit_clock(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png, page = tmp_path / "p.png", tmp_path / "p.html"
    code, out, _ = _run(["pipeline", "zb_h1", "--unit-costs", "--steps", "1", "--json", "--png", str(png),
                         "--html", str(page)], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["costs"] == {"F": 1.0, "I": 1.0, "W": 1.0} and doc["step_makespan"] == 27
    assert doc["matches_single_process"] is True and png.stat().st_size > 10_000
    assert "makespan 27, bubble 11.1%" in page.read_text()


def test_pipeline_timeline_draws_itself(tmp_path):
    """``op.timeline()`` is still the text grid, and draws the step it shows."""
    pytest.importorskip("matplotlib")
    import numpy as np

    from virtualpar import VirtualCluster, nn
    from virtualpar.pipeline import Pipeline, PipelinedOperation
    from virtualpar.sim import Hardware

    model = nn.Sequential(nn.Linear(4, 4, seed=0), nn.ReLU(), nn.Linear(4, 4, seed=1))
    op = PipelinedOperation(Pipeline(model, cuts=[2]), "1f1b", microbatches=4, costs={"F": 1, "B": 1})
    x = np.ones((8, 4), dtype=np.float32)
    with VirtualCluster(2, hardware=Hardware.unit()) as cluster:
        cluster.execute(op, x, x)
    tl = op.timeline()
    assert isinstance(tl, str) and "0F0" in tl
    assert tl.diagram.makespan == 2 * (4 + 1) and len(tl.diagram.compute) == 16
    assert tl.to_png(str(tmp_path / "t.png")) == str(tmp_path / "t.png")
    assert "<svg" in tl.to_html(str(tmp_path / "t.html"))
    wall = op.timeline(clock="wall").diagram
    assert wall.unit == "s" and len(wall.compute) == 16


def test_an_unpicklable_capture_is_named():
    import threading

    from virtualpar.errors import PayloadError
    from virtualpar.runtime.shipping import dumps_call

    def make():
        db = threading.Lock()
        return lambda dev: db.acquire()

    with pytest.raises(PayloadError, match=r"captures the variable 'db' \(a _thread\.lock\)"):
        dumps_call("<lambda>", make(), (), {})

    def helper(dev):
        return db2.locked()

    db2 = threading.Lock()
    with pytest.raises(PayloadError,
                       match=r"captures the variable 'db2' \(a _thread\.lock\), inside the variable "
                                           r"'helper'"):
        dumps_call("<lambda>", lambda dev: helper(dev), (), {})


def test_simulate_names_a_policy_of_the_wrong_type_at_the_call():
    from virtualpar.errors import UsageError
    from virtualpar.strategies import GPipe, OldestStageFirst, simulate

    with pytest.raises(UsageError,
                       match=r"simulate: policy must be a function \(batch, position\) -> sort key.*got "
                                         r"tuple \(-12, 6\).*not a call of it such as "
                                         r"OldestStageFirst\(6, 12\)"):
        simulate(4, 4, 8, GPipe, OldestStageFirst(6, 12))


def test_cuckoo_lowering_names_forward_and_backward_workers_the_right_way_round():
    from virtualpar.errors import UsageError
    from virtualpar.strategies import STRATEGIES, lower_strategy, simulate

    run = simulate(4, 4, 8, STRATEGIES["cuckoo"](4, 4, 8))
    with pytest.raises(UsageError,
                       match="stage 3 of batch 0 runs its forward on worker 3 and its backward on worker 0"):
        lower_strategy(run)


def test_every_hardware_option_lists_its_presets_and_these_commands_have_json():
    from virtualpar.cli import build_parser
    from virtualpar.sim.hardware import HARDWARE

    subs = build_parser()._subparsers._group_actions[0].choices
    with_hardware = []
    for name, parser in subs.items():
        for action in parser._actions:
            if "--hardware" in action.option_strings:
                with_hardware.append(name)
                assert tuple(action.choices) == tuple(HARDWARE), name
    assert {"tour", "pipeline", "run", "policies"} <= set(with_hardware)
    for name in ("schedule", "pipeline", "strategy", "tour"):
        assert any("--json" in a.option_strings for a in subs[name]._actions), name
    for name in ("schedule", "pipeline", "strategy"):
        costs = next(a for a in subs[name]._actions if "--costs" in a.option_strings)
        assert "cost units" in costs.help, name  # the unit of every cost argument


def test_schedule_help_gives_the_default_costs(capsys):
    code, out, _ = _run(["schedule", "--help"], capsys)
    text = " ".join(out.split())
    assert code == 0 and "default F=1,B=2 for gpipe" in text and "F=1,I=1,W=1 for zb_h1" in text


def test_the_executor_says_what_the_batch_must_be_a_multiple_of():
    import numpy as np

    from virtualpar import VirtualCluster, nn
    from virtualpar.errors import UsageError
    from virtualpar.pipeline import Pipeline, PipelinedOperation

    model = nn.Sequential(nn.Linear(4, 4, seed=0), nn.ReLU(), nn.Linear(4, 4, seed=1))
    op = PipelinedOperation(Pipeline(model, cuts=[2]), "1f1b", microbatches=6)
    x = np.ones((8, 4), dtype=np.float32)
    with VirtualCluster(2) as cluster:
        with pytest.raises(UsageError,
                           match="a batch of 8 rows does not split into 6 equal microbatches: give a "
                                             "batch whose rows are a multiple of 6"):
            cluster.execute(op, x, x)


@pytest.mark.slow
def test_tour_json_is_one_object_with_every_check(tmp_path, capsys):
    code, out, _ = _run(["tour", "--json", "--trace", str(tmp_path / "t.json")], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["correct"] is True and len(doc["rows"]) > 40
    assert {"op", "group", "algorithm", "nbytes", "modelled", "correct"} == set(doc["rows"][0])
