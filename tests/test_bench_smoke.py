"""Smoke test of ``benchmarks/bench_collectives.py``: ``--quick --json`` runs and reports every section.

No timing is asserted (a shared 2-core machine makes any threshold flaky); the test checks that
every benchmark ran, that the JSON has the documented structure, and that the derived columns
follow their definitions (NCCL's bus-bandwidth factors, the ratio against the bare fork).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_collectives.py")


@pytest.fixture(scope="module")
def result() -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--json"], capture_output=True, text=True,
                          timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_every_section_is_present(result):
    assert set(result) == {"meta", "memcpy", "p2p_latency", "p2p_bandwidth", "collectives", "contract_check",
                           "startup", "references", "latency_rounds", "allreduce_rounds", "targets"}
    meta = result["meta"]
    for key in ("date", "machine", "python", "numpy", "virtualpar", "hardware", "quick"):
        assert key in meta, key
    assert meta["quick"] is True and meta["hardware"] == "h100-node"


def test_sizes_and_rows(result):
    sizes = [r["bytes"] for r in result["memcpy"]]
    assert sizes == sorted(sizes) and all(s & (s - 1) == 0 for s in sizes)  # powers of two
    assert [r["bytes"] for r in result["p2p_bandwidth"]] == sizes
    expected = {("all_reduce", "default"), ("all_reduce", "shm"), ("all_reduce", "ring"),
                ("all_reduce", "tree"), ("all_reduce", "direct"), ("all_gather", "ring"),
                ("all_gather", "direct"), ("reduce_scatter", "ring")}
    for n in (2, 4):
        got = {(r["op"], r["algorithm"]) for r in result["collectives"] if r["devices"] == n}
        assert got == expected, (n, got)
        for op, algorithm in expected:
            rows = [
                r["bytes"]
                for r in result["collectives"]
                if r["devices"] == n and (r["op"], r["algorithm"]) == (op, algorithm)
            ]
            assert rows == sizes, (n, op, algorithm, rows)
    for r in result["collectives"]:
        assert r["time_s"] > 0 and r["model_s"] > 0


def test_bus_bandwidth_follows_nccl_definitions(result):
    for r in result["collectives"]:
        n = r["devices"]
        factor = 2 * (n - 1) / n if r["op"] == "all_reduce" else (n - 1) / n
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * factor)
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)


def test_startup_contract_check_and_targets(result):
    st = result["startup"]
    assert st["devices"] == 8 and st["ratio_bare"] == pytest.approx(st["first_run_s"] / st["bare_fork_s"])
    assert {r["devices"] for r in result["contract_check"]} == {2, 4}
    for r in result["contract_check"]:
        assert r["overhead_s"] == pytest.approx(r["on_s"] - r["off_s"])
    assert set(result["references"]) == {"mpi4py", "gloo"}  # skipped in quick mode, but reported
    assert all("skipped" in v for v in result["references"].values())
    assert "skipped" in result["latency_rounds"] and "skipped" in result["allreduce_rounds"]
    assert [t["pass"] in (True, False, None) for t in result["targets"]] == [True] * 4


def test_the_latency_target_is_the_median_of_the_paired_round_ratios(result):
    """With rounds measured in alternation, the target is the median of ours[i] / mpi4py[i], not
    the single figures of the main sequence (here made to disagree with the rounds), and not the
    ratio of the two medians (which pairs one side's loaded rounds with the other's quiet ones)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        from _report import evaluate_targets
    finally:
        sys.path.pop(0)
    staged = dict(result, p2p_latency=dict(result["p2p_latency"], latency_s=1.0))
    staged["references"] = {"mpi4py": {"2": {"latency_4KiB_s": 1e-6, "allreduce_GBps": {}}},
                            "gloo": {"skipped": "-"}}
    staged["latency_rounds"] = {"rounds": 3, "ours_s": [6e-6, 9e-6, 7e-6], "mpi4py_s": [8e-6, 8e-6, 10e-6]}
    (lat,) = [t for t in evaluate_targets(staged) if t["name"].startswith("4 KiB latency")]
    assert lat["value"] == pytest.approx(0.75) and lat["pass"] is True  # ratios 0.75 1.125 0.70
    assert "0.75 1.12 0.70" in lat["detail"] and "7 µs vs 8 µs" in lat["detail"]
    # a run whose load eased half-way: faster in 4 rounds of 5, yet the medians' ratio is 1.01
    staged["latency_rounds"] = {"rounds": 5, "ours_s": [8.8e-6, 9.2e-6, 9.0e-6, 6.7e-6, 6.6e-6],
                                "mpi4py_s": [10.6e-6, 11.1e-6, 8.7e-6, 8.5e-6, 8.5e-6]}
    (lat,) = [t for t in evaluate_targets(staged) if t["name"].startswith("4 KiB latency")]
    # ratios 0.83 0.83 1.03 0.79 0.78
    assert lat["value"] == pytest.approx(9.2 / 11.1) and lat["pass"] is True
    del staged["latency_rounds"]
    (lat,) = [t for t in evaluate_targets(staged) if t["name"].startswith("4 KiB latency")]
    assert lat["value"] == pytest.approx(1e6) and lat["pass"] is False


def test_the_all_reduce_target_takes_the_worst_size_of_the_paired_round_ratios(result):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        from _report import evaluate_targets
    finally:
        sys.path.pop(0)
    mib = 1 << 20
    staged = dict(result, allreduce_rounds={
        "rounds": 3, "sizes": [mib, 4 * mib],
        "2": {"ours_GBps": {str(mib): [1.0, 9.0, 3.0], str(4 * mib): [4.0, 4.0, 4.0]},
              "mpi4py_GBps": {str(mib): [2.0, 2.0, 2.0], str(4 * mib): [1.0, 8.0, 2.0]}},
        "4": {"ours_GBps": {str(mib): [1.0, 1.0, 1.0], str(4 * mib): [2.0, 2.0, 2.0]},
              "mpi4py_GBps": {str(mib): [0.5, 0.5, 9.0], str(4 * mib): [1.0, 1.0, 1.0]}}})
    (ar,) = [t for t in evaluate_targets(staged) if t["name"].startswith("all_reduce algbw")]
    assert ar["value"] == pytest.approx(1.5) and ar["pass"] is True  # n=2, 1 MiB: ratios 0.5 4.5 1.5
    assert "n=2 4 MiB: 2.00x" in ar["detail"] and "n=4 1 MiB: 2.00x" in ar["detail"]
    staged["allreduce_rounds"]["4"]["ours_GBps"][str(mib)] = [0.2, 0.2, 0.2]
    (ar,) = [t for t in evaluate_targets(staged) if t["name"].startswith("all_reduce algbw")]
    assert ar["value"] == pytest.approx(0.4) and ar["pass"] is False
    # paired, not medians: ours 1 10 10 vs 2 20 5 is 2x by the medians but 0.5x in two rounds of three
    staged["allreduce_rounds"]["4"]["ours_GBps"][str(mib)] = [1.0, 10.0, 10.0]
    staged["allreduce_rounds"]["4"]["mpi4py_GBps"][str(mib)] = [2.0, 20.0, 5.0]
    (ar,) = [t for t in evaluate_targets(staged) if t["name"].startswith("all_reduce algbw")]
    assert ar["value"] == pytest.approx(0.5) and ar["pass"] is False
