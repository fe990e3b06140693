"""What devices print reaches the driver as it comes: streamed, tagged ``[rank]`` when asked, and
forwarded to the driver's ``sys.stdout`` when that is no file descriptor (a notebook, a StringIO)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time

import pytest

from virtualpar import VirtualCluster
from virtualpar.cli import main
from virtualpar.runtime.output import NoRelay, OutputRelay, forwarding_needed, relay_for

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_programs")


def _speak(dev):
    print(f"out {dev.rank}")
    print(f"err {dev.rank}", file=sys.stderr)
    print(f"partial {dev.rank}", end="")  # no newline: still shown, ended, when the cluster closes
    return dev.rank


def test_a_stringio_stdout_receives_the_devices_prints_before_run_returns(monkeypatch, no_leaks):
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    with VirtualCluster(2) as cluster:
        assert isinstance(cluster._relay, OutputRelay) and not cluster._relay.tag
        assert cluster.run(_speak) == [0, 1]
        text = out.getvalue()  # read before close: run itself waited for the prints
        assert sorted(line for line in text.splitlines() if line.startswith("out")) == ["out 0", "out 1"]
        assert sorted(err.getvalue().split()) == ["0", "1", "err", "err"]
    assert "partial 0" in out.getvalue() and "partial 1" in out.getvalue()


def test_tagged_output_prefixes_every_line_with_its_rank(monkeypatch, no_leaks):
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    with VirtualCluster(3, tag_output=True) as cluster:
        cluster.run(lambda dev: print(f"a{dev.rank}\nb{dev.rank}"))
        cluster.run(_speak)
    lines = out.getvalue().splitlines()
    for r in range(3):
        assert [line for line in lines if line.startswith(f"[{r}] ")] == [
            f"[{r}] a{r}", f"[{r}] b{r}", f"[{r}] out {r}", f"[{r}] partial {r}"]
    assert sorted(err.getvalue().splitlines()) == ["[0] err 0", "[1] err 1", "[2] err 2"]


def test_no_relay_when_the_driver_writes_to_its_own_descriptors(monkeypatch):
    real = open(os.devnull, "w")  # noqa: SIM115
    try:
        os_out = os.dup(1)
        os.dup2(real.fileno(), 1)
        try:
            monkeypatch.setattr(sys, "stdout", os.fdopen(os.dup(1), "w"))
            monkeypatch.setattr(sys, "stderr", open(os.devnull, "w"))  # not descriptor 2's file: forwarded
            assert forwarding_needed()
            monkeypatch.setattr(sys, "stderr", os.fdopen(os.dup(2), "w"))
            # another descriptor, same open file: devices may write it directly
            assert not forwarding_needed()
            assert isinstance(relay_for(2, "fork", tag_output=False), NoRelay)
            monkeypatch.setattr(sys, "stdout", io.StringIO())
            assert forwarding_needed()
        finally:
            os.dup2(os_out, 1)
            os.close(os_out)
    finally:
        real.close()


def test_run_command_tags_device_prints_by_default_for_two_devices(tmp_path, capsys):
    script = tmp_path / "hello.py"
    script.write_text("def step(dev):\n    print('hello', dev.rank)\n    return dev.rank\n")
    assert main(["run", f"{script}:step", "-n", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sorted(out[:2]) == ["[0] hello 0", "[1] hello 1"]  # before the results, which follow run
    assert out[2].startswith("device 0 (world=0): 0   (modelled ")
    assert main(["run", f"{script}:step", "-n", "2", "--no-tag-output"]) == 0
    assert sorted(capsys.readouterr().out.splitlines()[:2]) == ["hello 0", "hello 1"]
    assert main(["run", f"{script}:step", "-n", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "hello 0"  # one device: no tag


def test_run_mpi_streams_each_line_as_it_is_printed():
    """A script that prints, sleeps 1 s, three times: its first line must arrive while it still
    runs (mpiexec shows it at once; the emulator held every line until the job ended).  Measured
    against the process's own end, not against a wall-clock budget."""
    proc = subprocess.Popen([sys.executable, "-m", "virtualpar", "run", "--mpi", "-n", "2",
                             os.path.join(HERE, "ticks.py")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    arrivals = []
    for line in proc.stdout:
        arrivals.append((time.monotonic(), line.rstrip("\n")))
    proc.wait(timeout=120)
    ended = time.monotonic()
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert sorted(text for _,
                  text in arrivals) == sorted(f"[{r}] rank {r} tick {i}" for r in range(2) for i in range(3))
    first = arrivals[0][0]
    # the last tick is printed 2 s after the first, then the script sleeps 1 s more: the first line
    # arrives about 3 s before the end when it streams, and with the last when it does not
    assert ended - first >= 1.5, [(round(t - first, 2), text) for t, text in arrivals]
    last_ticks = [t for t, text in arrivals if text.endswith("tick 2")]
    assert min(last_ticks) - first >= 1.5  # lines came a second apart, not in one burst


def _hello(dev):
    print("hi", dev.rank)
    return dev.rank


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_the_relay_reaches_devices_under_every_start_method(start_method, monkeypatch):
    """Spawned devices receive their pipes by pickling (each end is duplicated into the child)."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    with VirtualCluster(2, start_method=start_method, tag_output=True) as cluster:
        assert cluster.run(_hello) == [0, 1]
        assert sorted(out.getvalue().splitlines()) == ["[0] hi 0", "[1] hi 1"]
