"""Every command's default output fits 100 columns in one spelling of units; ``--width`` is honoured
where a command offers it; every command has ``--json``; every usage error exits 2 (issue 42).

The tour, the slowest command, is checked line by line in ``test_cli.py``'s tour test.
"""

from __future__ import annotations

import argparse
import json
import re

import pytest

from virtualpar.cli import build_parser, main
from virtualpar.pipeline import SCHEDULES
from virtualpar.strategies import STRATEGIES

WIDTH = 100
# a raw Python value or a unit spelt another way: "us", 1.6e-05, np.float64(...), {'F': 1.0}, [4, 3]
RAW = re.compile(r"\d us\b|\d(\.\d+)?e-\d\d|np\.\w+\(|\{'|\[\d+(, \d+)+\]")

SCRIPT = ("import numpy as np\n\ndef step(dev):\n"
          "    return dev.all_reduce(np.ones(1000, np.float32) * dev.rank).sum()\n")


def _out(argv: list[str], capsys) -> str:
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def _check(text: str, width: int = WIDTH) -> None:
    wide = [line for line in text.splitlines() if len(line) > width]
    assert wide == [], f"{len(wide)} lines wider than {width} columns, e.g. {wide[0]!r}"
    raw = [line for line in text.splitlines() if RAW.search(line)]
    assert raw == [], f"raw values or other spellings: {raw}"


def test_the_checks_can_fail():
    for bad in ("x" * 101, "took 16 us", "1.6e-05 seconds", "np.float64(3.0)", "costs {'F': 1.0}",
                "peaks [4, 3, 2, 1]"):
        with pytest.raises(AssertionError):
            _check(bad)
    _check("46.31 µs, 3 MiB, [rank 3], 1e9 FLOP/s")


@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prog.py").write_text(SCRIPT)
    return "prog.py:step"


DEFAULTS = ([["schedule", name] for name in SCHEDULES] + [["strategy", name] for name in STRATEGIES]
            + [["pipeline"], ["policies"], ["doctor"]])


@pytest.mark.parametrize("argv", DEFAULTS, ids=" ".join)
def test_every_command_at_its_defaults_fits_100_columns(argv, capsys):
    _check(_out(argv, capsys))


@pytest.mark.parametrize("extra", [[], ["-n", "16", "--stats"], ["--mesh", "dp=2,tp=2", "--stats"]],
                         ids=["defaults", "16 devices with stats", "2x2 with stats"])
def test_run_fits_100_columns(script, extra, capsys):
    """``run --stats`` on 16 devices printed a 180-column matrix of bare byte counts."""
    out = _out(["run", script, *extra], capsys)
    _check(out)
    if "--stats" in extra:
        assert "KiB" in out and "device-to-device" in out


def test_lab_list_fits_100_columns(capsys):
    _check(_out(["lab", "list"], capsys))


@pytest.mark.parametrize("argv", [["schedule", "1f1b"], ["schedule", "interleaved_1f1b"],
                                  ["schedule", "zbv", "--costs", "F=1,I=1.3,W=0.7"],
                                  ["strategy", "gpipe"], ["strategy", "looped"], ["policies"]],
                         ids=" ".join)
def test_width_80_is_honoured(argv, capsys):
    _check(_out([*argv, "--width", "80"], capsys), 80)


def test_run_honours_width_80(script, capsys):
    _check(_out(["run", script, "-n", "16", "--stats", "--width", "80"], capsys), 80)


def _leaves(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(command words, parser) of every command that runs, lab's subcommands included."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
        return
    for name, sub in subs[0].choices.items():
        yield from _leaves(sub, prefix + (name,))


COMMANDS = dict(_leaves(build_parser()))


def test_every_command_has_json():
    missing = [" ".join(words) for words, p in COMMANDS.items()
               if words != ("lab", "start") and "--json" not in p._option_string_actions]
    assert missing == []
    assert {" ".join(w) for w in COMMANDS} >= {"tour", "schedule", "pipeline", "policies", "strategy", "run",
                                              "doctor", "lab list", "lab check"}


@pytest.mark.parametrize("argv", [["schedule", "zb_h1"], ["strategy", "cuckoo"], ["lab", "list"]],
                         ids=" ".join)
def test_json_is_one_object_on_stdout(argv, capsys):
    assert isinstance(json.loads(_out([*argv, "--json"], capsys)), (dict, list))


def test_run_json_reports_every_device(script, capsys):
    doc = json.loads(_out(["run", script, "--mesh", "dp=2,tp=2", "--json", "--stats"], capsys))
    assert [d["rank"] for d in doc["devices"]] == [0, 1, 2, 3]
    assert doc["devices"][3]["coords"] == {"dp": 1, "tp": 1} and doc["devices"][0]["result"] == 6000.0
    assert all(d["modelled_s"] > 0 for d in doc["devices"])
    assert doc["stats"]["unit"] == "bytes" and len(doc["stats"]["bytes"]) == 4


# -- usage errors: exit 2 ---------------------------------------------------------------------------

#: What each command needs before its options (a valid value), and a refused one.
POSITIONAL = {("schedule",): ("1f1b", "nope"), ("strategy",): ("gpipe", "nope"),
              ("pipeline",): ("1f1b", "nope"),
              ("run",): ("prog.py:step", "missing.py:step"), ("lab", "start"): ("ring-allreduce", "nope"),
              ("lab", "check"): ("ring-allreduce", "nope")}
#: A value each option type refuses.
BAD = {"positive_int": "0", "natural_int": "-1", "positive_float": "0", "positive_number": "-1",
       "parse_mesh": "dp=x",
       "parse_costs": "Q=1", "table_width": "10", "output_file": "/nonexistent-dir/x.json",
       "png_file": "picture.svg", "_shape": "a,b", "int": "x", "probability": "1"}
#: Options that take any text: checked after parsing, below, or a folder to create.
FREE_TEXT = {("pipeline", "--schedule"), ("lab check", "--png"), ("train", "--save"), ("train", "--resume")}


def _bad_options():
    for words, parser in COMMANDS.items():
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0 or isinstance(action, argparse._HelpAction):
                continue
            flag = action.option_strings[-1]
            if action.choices is not None:
                yield words, flag, "no-such-choice"
            elif getattr(action.type, "__name__", None) in BAD:
                yield words, flag, BAD[action.type.__name__]
            else:
                yield words, flag, None


OPTIONS = list(_bad_options())


def test_every_option_that_takes_a_value_has_a_refused_value():
    free = {(" ".join(w), flag) for w, flag, bad in OPTIONS if bad is None}
    assert free == FREE_TEXT


@pytest.mark.parametrize("words, flag, bad", [o for o in OPTIONS if o[2] is not None],
                         ids=lambda v: " ".join(v) if isinstance(v, tuple) else str(v))
def test_a_bad_option_value_exits_2(words, flag, bad, script, capsys):
    argv = [*words, *([POSITIONAL[words][0]] if words in POSITIONAL else []), flag, bad]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2, capsys.readouterr()
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["schedule", "nope"], ["strategy", "nope"], ["pipeline", "nope"], ["pipeline", "--schedule", "nope"],
    ["run", "missing.py:step"], ["run", "prog.py"], ["tour", "--mesh", "x=1"], ["policies", "--shape", "1,2"],
    ["policies", "--shape", "100000000,100000000,100000000"], ["schedule", "zb_h1", "--costs", "B=2"],
    ["schedule", "1f1b", "--costs", "F=1", "--unit-costs"], ["strategy", "ddp", "--costs", "W=1"],
    ["strategy", "ddp", "--group-size", "2"], ["strategy", "gpipe", "--workers", "100000"],
    ["lab", "start", "nope"], ["lab", "check", "nope"], ["lab", "check", "zero1", "no_such_file.py"],
], ids=" ".join)
def test_a_usage_error_found_after_parsing_exits_2_before_any_work(argv, script, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    assert code == 2, capsys.readouterr()


def test_every_hardware_option_lists_its_presets():
    from virtualpar.sim.hardware import HARDWARE

    for words, parser in COMMANDS.items():
        action = parser._option_string_actions.get("--hardware")
        if action is not None:
            assert tuple(action.choices) == tuple(HARDWARE), words
            assert all(name in parser.format_help() for name in HARDWARE), words
