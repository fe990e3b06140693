"""Labs: every reference solution passes its own check, every untouched skeleton fails with
feedback that names the TODO, typical wrong solutions get the right diagnosis, and the commands
and the Gradescope JSON have the shapes graders read."""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path

import pytest

from virtualpar.cli import main
from virtualpar.errors import UsageError
from virtualpar.labs import CheckOptions, Lab, Report, available, get
from virtualpar.labs.registry import BUILTIN, ENTRY_POINT_GROUP

SOLUTIONS = Path(__file__).parent / "lab_solutions"
QUICK = CheckOptions(quick=True, width=100)


def _failed(report: Report) -> dict[str, str]:
    return {t.name: t.output for t in report.tests if t.status == "failed"}


@pytest.mark.parametrize("name", list(BUILTIN))
def test_reference_solution_passes_its_own_check(name):
    lab = get(name)
    report = lab.check(lab.reference, QUICK)
    assert report.passed, report.format()
    assert report.score == report.max_score > 0


@pytest.mark.parametrize("name", list(BUILTIN))
def test_untouched_skeleton_fails_naming_the_todo(name, tmp_path):
    lab = get(name)
    skeleton, _ = lab.start(tmp_path)
    report = lab.check(skeleton, QUICK)
    assert not report.passed and report.score < report.max_score
    text = report.format()
    assert "NotImplementedError" in text, text
    if "device" in text.split("NotImplementedError")[0]:  # run on devices: the student's own frame is shown
        assert str(skeleton) in text and "virtualpar/runtime" not in text, text


# (lab, wrong solution, the test that must fail, what its feedback must say)
WRONG = [
    ("ring-allreduce", "ring_blocking.py", "safe: strict (eager_limit=0)", "Deadlock"),
    ("ring-allreduce", "ring_gather0.py", "cost: bytes sent by the busiest device",
     "2.00x the bytes of a ring"),
    ("ring-allreduce", "ring_collective.py", "rules: no collectives", "build it from send/recv"),
    ("latency-bandwidth", "lb_ring_as_tree.py", "latency: messages sent by the busiest device",
     "sent 14 messages"),
    ("latency-bandwidth", "lb_no_inf.py", "crossover: the alpha-beta closed form", "crossover_bytes(2,"),
    ("megatron-mlp", "mm_no_group.py", "forward matches numpy", "group='tp'"),
    ("megatron-mlp", "mm_gathers_weights.py", "rules: only all_reduce over tp", "all_gather"),
    ("megatron-mlp", "mm_two_reduces.py", "forward: exactly one all-reduce of (batch, d)",
     "made 2 all-reduce"),
    ("sharding-policy", "sp_always_allreduce.py", "forward_bytes matches the explorer for every layout",
     "the explorer says"),
    ("sharding-policy", "sp_always_allreduce.py", "best_layouts picks the cheapest split",
     "the fewest bytes"),
    ("one-f-one-b", "ofob_gpipe.py", "memory: stage s holds at most min(R - s, M) microbatches", "holds 4"),
    ("one-f-one-b", "ofob_no_drain.py", "valid: every F and B once, in an order that can run", "B"),
    ("zero1", "zero_full_state.py", "memory: optimizer state for one shard only", "keeps 24 numbers"),
    ("zero1", "zero_all_reduce.py", "rules: only reduce_scatter and all_gather", "all_reduce"),
    ("timeline-gru", "tg_no_state.py", "time-split gradients equal the whole sequence's",
     "starting from the state"),
    ("timeline-gru", "tg_mean_loss.py", "forward and loss match a GRU over the whole sequence", "expected"),
    ("pipeline-dp", "pdp_world_group.py", "gradients match numpy over the whole batch", "CollectiveMismatch"),
    ("pipeline-dp", "pdp_ships_inputs.py", "communication: activations between stages, gradients over dp",
     "B*H*8"),
    ("parallel-3d", "p3d_pure_dp.py", "configure: dp = tp = pp = 2, valid for the model and batch", "dp=8"),
    ("parallel-3d", "p3d_ignores_memory.py", "configure: fits the memory budget", "the budget is"),
    ("parallel-3d", "p3d_ignores_memory.py", "bubble: the closed forms", "interleaved_1f1b"),
]


@pytest.mark.parametrize("name, solution, test, says", WRONG, ids=[w[1] + ":" + w[2][:20] for w in WRONG])
def test_wrong_solution_gets_the_right_diagnosis(name, solution, test, says):
    report = get(name).check(SOLUTIONS / solution, QUICK)
    failed = _failed(report)
    assert test in failed, report.format()
    assert says in failed[test], failed[test]


def test_every_lab_lists_goal_concept_and_difficulty():
    labs = available()
    assert len(labs) >= 9 and list(labs)[: len(BUILTIN)] == list(BUILTIN)
    for lab in labs.values():
        assert lab.goal and lab.concept and lab.difficulty in ("intro", "intermediate", "advanced")
        assert "TODO" in lab.skeleton.read_text() and "HOW IT IS CHECKED" in lab.skeleton.read_text()
        assert lab.background.read_text().startswith("# Lab")


def test_cli_start_check_and_gradescope_json(tmp_path, capsys):
    assert main(["lab", "list"]) == 0
    assert "ring-allreduce" in capsys.readouterr().out
    assert main(["lab", "start", "ring-allreduce", str(tmp_path)]) == 0
    skeleton = tmp_path / "ring_allreduce.py"
    assert skeleton.is_file() and (tmp_path / "LAB.md").is_file()
    capsys.readouterr()
    assert main(["lab", "start", "ring-allreduce", str(tmp_path)]) == 1  # never overwrites a student's work
    assert "already exist" in capsys.readouterr().err
    assert main(["lab", "check", "zero1", str(get("zero1").reference), "--json"]) == 0
    graded = json.loads(capsys.readouterr().out)
    assert graded["score"] == graded["max_score"] > 0
    for test in graded["tests"]:
        assert set(test) == {"name", "score", "max_score", "status", "output"} and test["status"] == "passed"
    assert main(["lab", "check", "one-f-one-b", str(SOLUTIONS / "ofob_gpipe.py"), "--json"]) == 1
    graded = json.loads(capsys.readouterr().out)
    assert graded["score"] < graded["max_score"] and any(t["status"] == "failed" for t in graded["tests"])


def test_unknown_lab_and_missing_file_are_named(tmp_path, capsys):
    with pytest.raises(UsageError, match="no lab named 'ring'.*ring-allreduce"):
        get("ring")
    assert main(["lab", "check", "zero1", str(tmp_path / "nope.py")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_course_plugs_in_its_own_lab_through_the_entry_point(tmp_path, monkeypatch):
    folder = tmp_path / "course_lab"
    folder.mkdir()
    for part in ("skeleton.py", "LAB.md", "reference.py"):
        (folder / part).write_text("# Lab: "
                                   "echo\n" if part == "LAB.md" else "def echo(x):\n    return x  # TODO\n")
    (tmp_path / "course_labs.py").write_text(
        "from pathlib import Path\nfrom virtualpar.labs import Lab, Report\n\n"
        "def _check(path, options):\n    report = Report('echo')\n    report.add('echoes', "
        "True)\n    return report\n\n"
        "LAB = Lab('echo', 'Return the input', 'plugins', 'intro', Path(__file__).parent / "
        "'course_lab', ('echo',), "
        "_check)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = metadata.EntryPoint("echo", "course_labs:LAB", ENTRY_POINT_GROUP)
    real = metadata.entry_points
    monkeypatch.setattr(metadata, "entry_points",
                        lambda **kw: [entry] if kw.get("group") == ENTRY_POINT_GROUP else real(**kw))
    assert "echo" in available()
    lab = get("echo")
    assert isinstance(lab, Lab) and lab.check(lab.reference).passed
    sys.modules.pop("course_labs", None)


def test_a_broken_lab_folder_is_refused(tmp_path):
    with pytest.raises(UsageError, match="has no skeleton.py"):
        Lab("x", "g", "c", "intro", tmp_path, ("f",), lambda p, o: Report("x"))


def test_check_draws_the_students_run_beside_the_reference(tmp_path):
    import matplotlib.image

    for name, solution in (("one-f-one-b", "ofob_gpipe.py"), ("ring-allreduce", "ring_gather0.py")):
        report = get(name).check(SOLUTIONS / solution, CheckOptions(quick=True, png=str(tmp_path)))
        assert len(report.pictures) == 2 and report.timeline, report.format()
        mine, ref = (matplotlib.image.imread(p) for p in report.pictures)
        # two different runs
        assert mine.shape[2] in (3, 4) and mine.shape != ref.shape or (mine != ref).any()
