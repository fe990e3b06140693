"""``virtualpar doctor``: the environment's findings, the live cluster's, and the exit code."""

from __future__ import annotations

import importlib
import json

import pytest

from virtualpar.cli import main
from virtualpar.commands import doctor


def test_doctor_measures_a_live_cluster_and_finds_it_clean(capsys):
    assert main(["doctor", "-n", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    live = {f["what"]: f for f in report["live"]}
    assert set(live) >= {"start", "all_reduce", "latency", "large messages", "memory per device", "close"}
    assert live["all_reduce"]["status"] == live["close"]["status"] == "OK"
    assert "no process and no shared memory left" in live["close"]["detail"]
    assert {f["what"] for f in report["environment"]} >= {"python", "numpy", "/dev/shm", "blas"}


def test_a_missing_extra_warns_and_a_missing_requirement_fails(monkeypatch):
    real = importlib.import_module

    def without(name, *a, **k):
        if name in ("mpi4py", "networkx"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(doctor.importlib, "import_module", without)
    found = {what: (status, detail) for status, what, detail in doctor.environment()}
    assert found["mpi4py"][0] == "WARN" and "pip install 'virtualpar[mpi]'" in found["mpi4py"][1]
    assert found["networkx"][0] == "FAIL"


def test_a_failed_finding_is_exit_code_1(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "live", lambda n: [("FAIL", "close", "left processes [123]")])
    assert main(["doctor", "-n", "2"]) == 1
    assert "FAIL  close" in capsys.readouterr().out


def test_the_live_check_reports_a_cluster_that_cannot_start(monkeypatch, capsys):
    def broken(n):
        raise OSError("no shared memory")

    monkeypatch.setattr(doctor, "live", broken)
    assert main(["doctor"]) == 1
    assert "FAIL  live cluster       OSError: no shared memory" in capsys.readouterr().out


def test_a_device_count_below_one_is_refused(capsys):
    with pytest.raises(SystemExit) as info:
        main(["doctor", "-n", "0"])
    assert info.value.code == 2 and "-n" in capsys.readouterr().err


def test_a_segment_left_behind_is_a_failure(monkeypatch):
    """The cluster's own name is unlinked at start-up, so looking for it could never fail."""
    calls = iter([set(), {"virtualpar-1-leaked"}])
    monkeypatch.setattr(doctor, "_segments", lambda: next(calls))
    close = {what: (status, detail) for status, what, detail in doctor.live(2)}["close"]
    assert close[0] == "FAIL" and "virtualpar-1-leaked" in close[1]


def test_the_tour_and_run_pick_hardware_for_the_mesh_size():
    from virtualpar.commands._args import default_hardware

    assert [default_hardware(None, n) for n in (4, 8, 16, 64, 12)] == ["h100-node", "h100-node", "h100-cluster",
                                                                         "h100-cluster", None]
    assert default_hardware("laptop", 64) == "laptop"  # the tour at 64 devices said h100-node holds at most 8
