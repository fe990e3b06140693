"""Pictures and progress of the commands: ``run --png``, ``policies --png``, progress bars only on a
terminal, and every line of their default output within 100 columns."""

from __future__ import annotations

import builtins
import io
import sys

import pytest

from virtualpar.cli import main
from virtualpar.commands._progress import bar
from virtualpar.trace import Event, Trace

PNG = b"\x89PNG\r\n\x1a\n"
MS = 1e-3


def _no_matplotlib(monkeypatch):
    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)


# -- progress ----------------------------------------------------------------------------------------

class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_draws_on_a_terminal_only(monkeypatch):
    quiet = io.StringIO()  # a pipe or a file: isatty() is False
    monkeypatch.setattr(sys, "stderr", quiet)
    with bar(3, "steps") as b:
        for _ in range(3):
            b()
    assert quiet.getvalue() == ""
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    with bar(None, "candidates run", "candidate") as b:
        b(4)  # the total, once known
        for _ in range(4):
            b()
    # (tqdm redraws at most every 0.1 s)
    assert "candidates run" in tty.getvalue() and "0/4" in tty.getvalue()


def test_policies_shows_progress_on_a_terminal_and_nothing_otherwise(capsys, monkeypatch):
    argv = ["policies", "--mesh", "x=2", "--shape", "4,4,4"]
    assert main(argv) == 0
    assert capsys.readouterr().err == ""  # captured stderr is no terminal
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "policies run" in captured.err and "/8 " in captured.err  # 7 named policies and auto
    assert "policies run" not in captured.out


# -- policies ----------------------------------------------------------------------------------------

def test_policies_table_fits_the_width_in_one_spelling_of_units(capsys):
    assert main(["policies", "--mesh", "x=2,y=2", "--shape", "64,32,48"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in out) <= 100
    assert not [line for line in out if " us" in line or "e-0" in line or "e+0" in line]
    head = next(line for line in out if line.startswith("policy"))
    assert head.split() == ["policy", "ok", "model", "estimate", "sent/dev", "FLOP/dev", "peak/dev", "host",
                            "in", "host", "out", "wall"]
    # row: 64x32 @ 32x48 float32 sharded on the inner dim over 4 devices, each all_reduces its 64x48
    # partial C by ring: 2(p-1)/p of 12 KiB = 18 KiB sent per device; 2·64·8·48 = 49,152 FLOPs each
    row = next(line for line in out if line.startswith("row "))
    assert "18 KiB" in row and "49.15k" in row
    assert main(["policies", "--mesh", "x=2,y=2", "--shape", "64,32,48", "--width", "80"]) == 0
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 80


def test_policies_png_and_its_missing_matplotlib(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    path = tmp_path / "policies.png"
    assert main(["policies", "--mesh", "x=2", "--shape", "8,8,8", "--png", str(path)]) == 0
    assert path.read_bytes()[:8] == PNG and f"chart: {path}" in capsys.readouterr().out
    _no_matplotlib(monkeypatch)
    other = tmp_path / "none.png"
    assert main(["policies", "--mesh", "x=2", "--shape", "8,8,8", "--png", str(other)]) == 1
    err = capsys.readouterr().err
    assert 'pip install "virtualpar[viz]"' in err and not other.exists()


def test_policy_chart_has_a_bar_per_policy_split_in_compute_and_communication(tmp_path):
    pytest.importorskip("matplotlib")
    from virtualpar.commands._policy_chart import draw
    from virtualpar.tensor_parallel.table import PolicyRow

    rows = [PolicyRow("a", "-", True, 0.0, (), 2048, 0, 0, 10, 4096, 0.1, 3e-6, 3e-6, True,
                      modelled_compute_s=1e-6, modelled_comm_s=2e-6),
            PolicyRow("b", "-", False, float("nan"), (), 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, False, "cannot apply")]
    path = draw(rows, tmp_path / "c.png", "title")
    assert open(path, "rb").read(8) == PNG


# -- run ---------------------------------------------------------------------------------------------

def test_run_png_names_each_collective_on_its_boxes(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    script = tmp_path / "step.py"
    script.write_text("import numpy as np\n\ndef step(dev):\n    dev.all_reduce(np.ones(1000))\n"
                      "    dev.all_gather(np.ones(100), dim=0)\n    return dev.rank\n")
    path = tmp_path / "run.png"
    assert main(["run", f"{script}:step", "-n", "2", "--png", str(path)]) == 0
    out = capsys.readouterr().out
    assert path.read_bytes()[:8] == PNG and f"timeline: {path}" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_gantt_labels_a_collective_by_name_or_initials_by_room():
    pytest.importorskip("matplotlib")
    from virtualpar.trace.gantt import figure

    def ev(rank, kind, name, s, e):
        return Event(rank, kind, name, s * MS, e * MS, s * MS, e * MS,
                     group=(0, 1) if kind == "collective" else None)

    trace = Trace([ev(0, "compute", "compute", 0, 50), ev(0, "collective", "all_reduce", 50, 100),
                   ev(1, "collective", "all_reduce", 50, 100),
                   ev(0, "collective", "reduce_scatter", 100, 102),
                   ev(1, "collective", "broadcast", 102, 102.01)])
    fig = figure(trace)
    texts = [t.get_text() for t in fig.axes[0].texts]
    # half the axis is room for "all_reduce" on both devices; 2 % is room for "RS" only; 0.01 % for nothing
    assert sorted(texts) == ["RS", "all_reduce", "all_reduce"]
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["compute", "all_reduce", "reduce_scatter", "broadcast"]


def test_run_png_without_matplotlib_says_how_to_install(tmp_path, capsys, monkeypatch):
    script = tmp_path / "step.py"
    script.write_text("def step(dev):\n    return 1\n")
    _no_matplotlib(monkeypatch)
    assert main(["run", f"{script}:step", "--png", str(tmp_path / "x.png")]) == 1
    assert 'pip install "virtualpar[viz]"' in capsys.readouterr().err


def test_a_cluster_of_64_devices_shows_its_start_on_a_terminal(monkeypatch):
    """The library draws nothing: it calls ``progress()`` as each device is ready; the command's bar
    counts them, on a terminal only."""
    from virtualpar import Mesh, VirtualCluster
    from virtualpar.commands._progress import start_cluster

    ready = []
    with VirtualCluster(3, progress=lambda: ready.append(len(ready)), warm_up=False):
        assert ready == [0, 1, 2]
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    with start_cluster(Mesh({"world": 64}), warm_up=False) as cluster:
        assert cluster.size == 64
    assert "starting 64 devices" in tty.getvalue() and "/64" in tty.getvalue()
    with start_cluster(Mesh({"world": 8}), warm_up=False):
        pass
    assert "starting 8" not in tty.getvalue()  # 8 devices start in a blink: no bar
    quiet = io.StringIO()
    monkeypatch.setattr(sys, "stderr", quiet)
    with start_cluster(Mesh({"world": 64}), warm_up=False):
        pass
    assert quiet.getvalue() == ""
