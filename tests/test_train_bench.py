"""``benchmarks/bench_train.py --quick --json``: the structure of its result (no time is asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_train_quick_reports_the_ratio_against_its_floor():
    script = os.path.join(ROOT, "benchmarks", "bench_train.py")
    done = subprocess.run([sys.executable, script, "--quick", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["model"] == "tiny" and out["target"] == 1.5 and len(out["rounds"]) == 1
    r = out["rounds"][0]
    copy_s = r["bytes_moved"] / (r["memcpy_GBps"] * 1e9)
    assert r["floor_s"] == pytest.approx(r["kernels_s"] + copy_s, rel=1e-12)
    assert r["ratio"] == pytest.approx(r["wall_s"] / r["floor_s"], rel=1e-12) and r["bytes_moved"] > 0
    assert out["modelled_step_s"] > 0 and out["peers"] == []
