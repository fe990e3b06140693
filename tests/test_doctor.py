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

    assert [default_hardware(None, n) for n in (4, 8, 16, 64, 12)] == ["h100-node", "h100-node",
                                                                       "h100-cluster",
                                                                         "h100-cluster", None]
    assert default_hardware("laptop", 64) == "laptop"  # the tour at 64 devices said h100-node holds at most 8


def _doctor_in_subprocess(prelude: str, tmp_path, pythonpath: str | None = None):
    """``virtualpar doctor -n 1`` in a fresh interpreter after ``prelude`` (which hides a module),
    so nothing hidden leaks into this test process."""
    import os
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (pythonpath, repo) if p))
    code = f"import sys\n{prelude}\nfrom virtualpar.cli import main\nsys.exit(main(['doctor', '-n', '1']))\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120)


def _lines(out: str, what: str) -> list[str]:
    """The doctor's findings about ``what``, each with its wrapped continuation lines joined."""
    entries: list[list[str]] = []
    for line in out.splitlines():
        words = line.split()
        if words[:1] and words[0] in ("OK", "WARN", "FAIL"):
            entries.append([line.strip()])
        elif entries and line.startswith(" " * 10) and words:
            entries[-1].append(line.strip())
    return [" ".join(e) for e in entries if e[0].split()[1:2] == [what]]


def test_a_missing_required_module_fails_naming_it_and_the_install_that_brings_it(tmp_path):
    """The fault a clean venv met: scipy (pulled in by nn's exact GELU through autograd.scipy)
    missing, every environment line OK, and the tour dying half-way.  Now the doctor imports every
    module of virtualpar and says which failed, why, and what to install."""
    got = _doctor_in_subprocess("sys.modules['scipy'] = None", tmp_path)
    assert got.returncode == 1, got.stdout + got.stderr
    assert "Traceback" not in got.stdout + got.stderr
    (imports,) = _lines(got.stdout, "imports")
    assert imports.startswith("FAIL") and "import virtualpar.nn" in imports
    assert 'scipy is missing, a requirement of virtualpar: python -m pip install "scipy>=1.11"' in imports
    assert _lines(got.stdout, "scipy")[0].startswith("FAIL")


def test_a_module_that_breaks_on_import_is_a_failure_not_a_traceback(tmp_path):
    """autograd 1.6 under numpy 2 raises AttributeError (numpy.linalg.linalg) when imported: the
    doctor used to crash with that traceback.  A stand-in autograd that raises the same way."""
    fake = tmp_path / "fake" / "autograd"
    fake.mkdir(parents=True)
    message = "module 'numpy.linalg' has no attribute 'linalg'"
    (fake / "__init__.py").write_text(f"raise AttributeError({message!r})\n")
    got = _doctor_in_subprocess("", tmp_path, pythonpath=str(tmp_path / "fake"))
    assert got.returncode == 1, got.stdout + got.stderr
    assert "Traceback" not in got.stdout + got.stderr
    (autograd,) = _lines(got.stdout, "autograd")
    assert autograd.startswith("FAIL") and "AttributeError" in autograd and "autograd[scipy]>=1.7" in autograd
    imports = _lines(got.stdout, "imports")
    assert any(line.startswith("FAIL") and "raised in autograd" in line and "python -m pip install -U" in line
               for line in imports), imports


def test_a_missing_extra_is_a_warning_that_names_what_it_disables(tmp_path):
    got = _doctor_in_subprocess("sys.modules['matplotlib'] = None", tmp_path)
    assert got.returncode == 0, got.stdout + got.stderr
    (viz,) = _lines(got.stdout, "matplotlib")
    assert viz.startswith("WARN") and "PNG timelines" in viz and "virtualpar[viz]" in viz
    (imports,) = _lines(got.stdout, "imports")
    assert imports.startswith("OK") and "modules of virtualpar import" in imports


def test_every_module_imports_here():
    """The import check itself, in this environment: every module, none failed."""
    from virtualpar.commands._imports import import_findings

    assert [status for status, _, _ in import_findings()] == ["OK"]


def test_each_kind_of_failed_import_names_its_fix():
    from virtualpar.commands._imports import _cause

    reqs = {"scipy": "scipy>=1.11"}
    assert _cause(ModuleNotFoundError("No module named 'scipy'", name="scipy"), reqs) == (
        "FAIL", 'scipy is missing, a requirement of virtualpar: python -m pip install "scipy>=1.11"')
    status, why = _cause(ModuleNotFoundError("No module named 'sklearn'", name="sklearn"), reqs)
    assert status == "FAIL" and "virtualpar does not declare it" in why and why.endswith("pip install "
                                                                                         "sklearn")
    status, why = _cause(ModuleNotFoundError("nope", name="matplotlib.pyplot"), reqs)
    assert status == "WARN" and "PNG timelines" in why and 'pip install "virtualpar[viz]"' in why
    try:  # how virtualpar.mpi.device says it: its own message, mpi4py's ImportError as the cause
        try:
            raise ModuleNotFoundError("No module named 'mpi4py'", name="mpi4py")
        except ImportError as exc:
            raise ImportError("the MPI backend needs mpi4py") from exc
    except ImportError as wrapped:
        status, why = _cause(wrapped, reqs)
    assert status == "WARN" and 'pip install "virtualpar[mpi]"' in why


def test_requirements_are_read_from_the_installed_metadata_without_the_extras():
    from virtualpar.commands._imports import requirements

    reqs = requirements()
    assert reqs["scipy"].startswith("scipy>=") and reqs["autograd"].startswith("autograd[scipy]>=")
    assert not {"pytest", "matplotlib", "mpi4py", "sybil"} & set(reqs)


def test_without_pytest_the_plugin_is_a_warning_not_a_failure(tmp_path):
    """``pip install -e .`` without the test extra has no pytest: only the plugin needs it."""
    got = _doctor_in_subprocess("sys.modules['pytest'] = None", tmp_path)
    assert got.returncode == 0, got.stdout + got.stderr
    (imports,) = _lines(got.stdout, "imports")
    assert (
        imports.startswith("WARN") and "import virtualpar.testing.plugin failed: pytest is missing" in imports
    )
    assert 'python -m pip install "virtualpar[test]"' in imports
