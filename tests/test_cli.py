"""``virtualpar tour`` end to end: every collective checked, a table, a trace that loads."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import pytest

from virtualpar import Mesh, UsageError
from virtualpar.cli import main
from virtualpar.collectives import ALGORITHMS
from virtualpar.tour import TOUR_CASES, run_tour

from ._shm import left_behind


def test_tour_checks_every_collective_and_writes_a_trace(tmp_path):
    out = io.StringIO()
    trace_path = tmp_path / "tour.json"
    rows = [r for r in run_tour(out, trace_path=str(trace_path)) if r.op != "section"]
    expected_rows = 3 * sum(len(ALGORITHMS[op]) for op in TOUR_CASES)  # 3 groups: tp, dp, all
    assert len(rows) == expected_rows
    assert all(r.correct for r in rows), [r for r in rows if not r.correct]
    text = out.getvalue()
    assert f"{expected_rows} of {expected_rows} collective runs match numpy" in text
    assert "bytes moved" in text and "modelled" in text and str(trace_path) in text
    doc = json.loads(trace_path.read_text())
    names = [
        e["args"]["name"] for e in doc["traceEvents"] if e.get("ph") == "M" and e["name"] == "process_name"
    ]
    assert "device 3 (dp=1, tp=1)" in names
    # ring all_reduce of a 4x6 float32 array (M = 96 B) in groups of n = 2 moves 2(n-1)/n * M per
    # device, on all 4 devices; direct moves (n-1) * M per device
    ring_tp = next(r for r in rows if (r.op, r.group, r.algorithm) == ("all_reduce", "tp", "ring"))
    assert ring_tp.nbytes == 4 * 2 * (2 - 1) * 96 // 2
    direct_all = next(r for r in rows if (r.op, r.group, r.algorithm) == ("all_reduce", "all", "direct"))
    assert direct_all.nbytes == 4 * (4 - 1) * 96
    # every line fits 100 columns, in one spelling of units (lines went up to 205 columns, with "us"
    # and 1.59e-08 seconds); the pipeline and strategy grids fold their steps into blocks (they ran to
    # 138 and 174 columns)
    own = text.splitlines()
    assert "== Tensor parallelism" in text and "== Timeline parallelism" in text
    assert [line for line in own if len(line) > 100 and line.strip() != str(trace_path)] == []
    assert not [line for line in own if re.search(r"\d us\b|\de-\d\d", line)]


def test_the_tour_runs_on_any_mesh_of_two_devices_or_more(tmp_path, monkeypatch):
    """--mesh x=4 failed on 'unknown mesh axis tp'; dp=2,tp=1 on 'root=1 is out of range'."""
    import virtualpar.tour as tour
    monkeypatch.setattr(tour, "TOUR_SECTIONS", ())  # the pipeline sections do not use the mesh
    out = io.StringIO()
    rows = run_tour(out, trace_path=str(tmp_path / "t.json"), mesh=Mesh({"a": 2, "b": 1, "c": 3}))
    assert {r.group for r in rows} == {"c", "a", "all"}  # every axis of more than one device, then all
    assert len(rows) == 3 * sum(len(ALGORITHMS[op]) for op in TOUR_CASES)
    assert all(r.correct for r in rows), [r for r in rows if not r.correct]
    with pytest.raises(UsageError, match="at least 2 devices"):
        run_tour(out, trace_path=str(tmp_path / "t.json"), mesh=Mesh({"dp": 1, "tp": 1}))
    rows = run_tour(out, trace_path=str(tmp_path / "t.json"), mesh=Mesh({"x": 3}))
    assert {r.group for r in rows} == {"all"}  # x spans every device: the same group, toured once


def test_cli_entry_point_and_module_run(tmp_path):
    assert main(["tour", "--trace", str(tmp_path / "t.json")]) == 0
    version = subprocess.run([sys.executable, "-m", "virtualpar", "--version"], capture_output=True,
                             text=True)
    assert version.returncode == 0 and "virtualpar" in version.stdout


def test_run_command_runs_a_scripts_function_on_every_device(tmp_path):
    script = tmp_path / "step.py"
    script.write_text("import numpy as np\n\nlimit = 3\n\ndef step(dev):\n"
                      "    return float(dev.all_reduce(np.full(2, dev.index.tp + 1.0), group='tp')[0])\n")
    done = subprocess.run([sys.executable, "-m", "virtualpar", "run", f"{script}:step", "--mesh",
                           "dp=2,tp=2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 4 and all(": 3.0" in line for line in lines)
    bad = subprocess.run([sys.executable, "-m", "virtualpar", "run", f"{script}:nope"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode != 0 and "has no function 'nope'; its functions: ['step']" in bad.stderr
    value = subprocess.run([sys.executable, "-m", "virtualpar", "run", f"{script}:limit"],
                           capture_output=True,
                           # it said "has no function 'limit'", which it has, as an int
                           text=True, timeout=120)
    assert (
        value.returncode != 0
        and "defines 'limit' as int, not a function; its functions: ['step']" in value.stderr
    )
    mpi = subprocess.run([sys.executable, "-m", "virtualpar", "run", "--mpi", "-n", "2", f"{script}:step"],
                         capture_output=True, text=True, timeout=120)
    assert (
        mpi.returncode == 2 and f"(to run step(dev) from {script} on every device, drop --mpi)" in mpi.stderr
    )


def test_run_says_what_a_script_target_is_missing_and_shows_only_the_scripts_own_errors(tmp_path, capsys):
    """No devices start for these: each is a mistake in the command line or in the script itself."""
    import pytest

    def fails(*argv: str) -> str:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main(["run", *argv])
        if exc.value.code == 2:  # a usage error: the message on stderr, exit 2 as argparse's
            return capsys.readouterr().err.strip()
        return str(exc.value.code)

    step = tmp_path / "step.py"
    step.write_text("import numpy as np\nfrom os import path\n\ndef step(dev):\n    return 1\n")
    assert fails(str(step)).endswith(f"got {str(step)!r}; {step} defines step: e.g. "
                                     f"virtualpar run {step}:step")
    assert "there is no file 'missing.py'" in fails("missing.py")
    syntax = tmp_path / "syntax.py"
    syntax.write_text("def step(dev)\n    pass\n")
    shown = fails(f"{syntax}:step")
    assert shown.startswith(f"virtualpar run: importing {syntax} "
                            "failed:") and shown.endswith("SyntaxError: expected ':'")
    raising = tmp_path / "raising.py"
    raising.write_text("import json\n\njson.loads('{')\n\ndef step(dev):\n    pass\n")
    shown = fails(f"{raising}:step")
    assert f'File "{raising}", line 3, in <module>' in shown and "JSONDecodeError" in shown
    assert "importlib" not in shown and "virtualpar/commands" not in shown  # the script's frames, not ours


def test_run_argument_mistakes_name_what_is_wrong_with_the_full_usage(tmp_path, capsys):
    step = tmp_path / "step.py"
    step.write_text("def step(dev):\n    return 1\n")
    # not "target, script_args"
    for argv, said in ((["run"], "the following arguments are required: target\n"),
                       # was "unrecognized"
                       (["run", str(step), "--mpi", "-n", "4"], "--mpi goes before FILE.py"),
                       (["run", f"{step}:step", "-n", "0"], "argument -n: must be an int >= 1, got 0")):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2 and said in err, (argv, err)
        # the whole usage, not the late options'
        assert "[--mpi]" in err and "[--trace FILE.json]" in err, err


def test_run_takes_the_op_timeout(tmp_path, capsys):
    step = tmp_path / "step.py"
    step.write_text("def step(dev):\n    return dev.config.timeout\n")
    assert main(["run", f"{step}:step", "--timeout", "7"]) == 0
    assert "device 0 (world=0): 7.0" in capsys.readouterr().out
    for bad in ("0", "-1", "nan", "soon"):
        with pytest.raises(SystemExit):
            main(["run", f"{step}:step", "--timeout", bad])
        assert "argument --timeout: must be a number of seconds > 0" in capsys.readouterr().err


_UNSAFE_RING = ("import numpy as np\n\ndef ring(dev):\n    right, left = (dev.rank + 1) % dev.size, "
                "(dev.rank - 1) % dev.size\n"
                "    dev.send(np.full(1000, float(dev.rank)), right)\n    return float(dev.recv(left)[0])\n")
_UNSAFE_MPI = ("from mpi4py import MPI\nimport numpy as np\ncomm = MPI.COMM_WORLD\nr, n = "
               "comm.Get_rank(), comm.Get_size()\n"
               "comm.send(np.full(1000, float(r)), dest=(r + 1) % "
               "n)\nprint(comm.recv(source=(r - 1) % n)[0])\n")


@pytest.mark.parametrize("mpi", [False, True])
def test_run_in_strict_mode_names_the_deadlock_that_buffering_hides(tmp_path, capsys, mpi):
    """Everybody sends right, then receives from the left: buffered it passes, with --eager-limit 0
    (each send waits for its receive, as above MPI's eager limit) it is the named cycle, for a
    function on the devices and for an unmodified mpi4py script alike; --shuffle takes a seed."""
    script = tmp_path / "unsafe.py"
    script.write_text(_UNSAFE_MPI if mpi else _UNSAFE_RING)
    target = ["--mpi", str(script)] if mpi else [f"{script}:ring"]
    assert main(["run", "-n", "3", *target]) == 0
    assert main(["run", "-n", "3", "--shuffle", "5", *target]) == 0
    capsys.readouterr()
    assert main(["run", "-n", "3", "--eager-limit", "0", *target]) == 1
    err = capsys.readouterr().err
    assert (
        "Deadlock: deadlock (a cycle of waits): device 0 waits send to 1 (tag 0) ← device 1 waits send to 2"
        in err
    )
    assert main(["run", "-n", "3", "--eager-limit", "16384", *target]) == 0  # 8000 bytes: eager again
    for option, bad in (("--eager-limit", "-1"), ("--shuffle", "x")):
        with pytest.raises(SystemExit):
            main(["run", "-n", "3", option, bad, *target])
        assert f"argument {option}: must be an int >= 0" in capsys.readouterr().err


def test_run_under_mpiexec_refuses_the_emulators_modes(tmp_path, capsys, monkeypatch):
    """Strict and shuffled mode are the emulator's: under mpiexec they would be silently ignored."""
    script = tmp_path / "unsafe.py"
    script.write_text(_UNSAFE_RING)
    monkeypatch.setenv("PMI_RANK", "0")  # what mpiexec sets: the command then runs on MPI, not devices
    for option in ("--eager-limit", "--shuffle"):
        assert main(["run", f"{script}:ring", option, "0"]) == 2
        assert "are modes of the emulator; under mpiexec the MPI library decides" in capsys.readouterr().err


def test_run_models_a_cluster_beyond_one_node_and_names_user_errors(tmp_path):
    script = tmp_path / "step.py"
    script.write_text("import numpy as np\n\ndef step(dev):\n    return "
                      "float(dev.all_reduce(np.ones(2))[0])\n\n"
                      "def bad(dev):\n    return dev.index.tp\n")
    big = subprocess.run([sys.executable, "-m", "virtualpar", "run", f"{script}:step", "-n", "12"],
                         capture_output=True, text=True, timeout=120)
    assert big.returncode == 0, big.stderr  # 12 devices: more than a node, not whole nodes: the mesh's links
    assert big.stdout.count(": 12.0") == 12
    bad = subprocess.run([sys.executable, "-m", "virtualpar", "run", f"{script}:bad"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 1
    # the user's mistake, named as one (it read "raised AttributeError in virtualpar code (mesh/index.py)")
    assert bad.stderr.rstrip().splitlines()[-1].startswith("virtualpar run: UnknownAxisError: device ")
    # remote traceback
    assert "unknown mesh axis 'tp'" in bad.stderr and 'step.py", line 7, in bad' in bad.stderr
    wrong = subprocess.run([sys.executable, "-m", "virtualpar", "run", f"{script}:step", "-n", "12",
                            "--hardware", "h100-node"], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
    assert (
        "virtualpar run: MeshError: hardware 'h100-node' is a single node of at most 8 devices"
        in wrong.stderr
    )
    sixteen = subprocess.run([sys.executable, "-m", "virtualpar", "run", f"{script}:step", "-n", "16"],
                             capture_output=True, text=True, timeout=120)
    assert sixteen.returncode == 0 and sixteen.stdout.count(": 16.0") == 16, sixteen.stderr  # two 8-GPU nodes


@pytest.mark.parametrize("argv, option", [
    # was: "has not run on this cluster, so it holds none of its weights"
    (["pipeline", "--steps", "0"], "--steps"),
    # was: "(nothing ran)" and "matches single-process training: yes"
    (["pipeline", "--batch", "0"], "--batch"),
    (["pipeline", "--microbatches", "-1"], "--microbatches"),
    # was: "ranks must be a positive int", an option nobody typed
    (["schedule", "1f1b", "--stages", "0"], "--stages"),
    (["schedule", "1f1b", "--virtual", "0"], "--virtual"),
    (["strategy", "ddp", "--workers", "0"], "--workers"),
    (["strategy", "ddp", "--max-activations", "x"], "--max-activations"),
    (["run", "script.py:f", "-n", "0"], "-n"),  # given after the target, parsed again
])
def test_a_count_below_one_is_refused_naming_its_option(argv, option, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: must be an int >= 1, got" in err, err


@pytest.mark.parametrize("argv, said", [
    # was dp=2, silently
    (["run", "s.py:f", "--mesh", "dp=2,dp=2"], "argument --mesh: mesh axis 'dp' is given twice"),
    # was "invalid parse_mesh value"
    (["run", "s.py:f", "--mesh", "dp=0"], "argument --mesh: mesh axis 'dp' has size 0"),
    (["tour", "--trace", "/nonexistent/t.json"],
     "argument --trace: cannot write '/nonexistent/t.json': the folder /nonexistent does not exist"),
    # was a traceback after the run
    (["run", "s.py:f", "--trace", "/nonexistent/t.json"], "argument --trace: cannot write"),
    # printed nothing, exit 0
    (["policies", "--explore", "-1"], "argument --explore: must be an int >= 1, got -1"),
])
def test_a_bad_option_is_refused_before_any_work(argv, said, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert said in capsys.readouterr().err


def test_ctrl_c_ends_a_run_in_one_line_and_leaves_nothing_behind(tmp_path):
    """It printed a 30-line KeyboardInterrupt traceback from inside multiprocessing."""
    import os
    import signal
    import time

    script = tmp_path / "step.py"
    script.write_text("import time\n\ndef sleepy(dev):\n    print('started', "
                      "flush=True)\n    time.sleep(1000)\n")
    before = set(os.listdir("/dev/shm"))
    # a shell that started pytest in the background hands it SIGINT ignored, and Python keeps an
    # ignored SIGINT ignored: the child gets the default back, as it has when started from a terminal
    proc = subprocess.Popen([sys.executable, "-m", "virtualpar", "run", f"{script}:sleepy", "-n", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while "started" not in proc.stdout.readline() and time.monotonic() < deadline:
        pass
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "virtualpar run: interrupted"
    assert "Traceback" not in err
    assert not left_behind(before)


def test_run_timeout_ends_a_run_whose_devices_are_busy_in_their_own_code(tmp_path):
    """No op times out while every device sleeps in the user's function: only a run timeout can end it."""
    script = tmp_path / "step.py"
    script.write_text("import time\n\ndef sleepy(dev):\n    time.sleep(1000)\n")
    done = subprocess.run([sys.executable, "-m", "virtualpar", "run", f"{script}:sleepy", "-n", "2",
                           "--run-timeout", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "virtualpar run: RunTimeout" in done.stderr
    assert 'step.py", line 4, in sleepy' in done.stderr  # where each device was
