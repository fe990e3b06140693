"""Every benchmark flag says what it does (issue 42: "Benchmark flags have no help text"), and the
report module spells time as the rest of virtualpar does."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "bench_*.py")))


def _help(script: str) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), COLUMNS="200")
    proc = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=120,
                          env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _options(text: str) -> dict[str, str]:
    """Each option of an argparse --help (COLUMNS=200: one option per line, its help after it)."""
    body = text.split("options:", 1)[1]
    out: dict[str, str] = {}
    last = None
    for line in body.splitlines():
        m = re.match(r"^  (-{1,2}[\w-]+)(.*)$", line)
        if m:
            last = m.group(1)
            rest = re.sub(r"^(\s[A-Z_]+|\s\{[^}]*\})?(, -{1,2}[\w-]+(\s[A-Z_]+)?)*", "", m.group(2))
            out[last] = rest.strip()
        elif last and line.startswith("   "):
            out[last] = (out[last] + " " + line.strip()).strip()
    return out


def test_there_are_benchmarks():
    assert len(BENCHMARKS) >= 7


@pytest.mark.parametrize("script", BENCHMARKS, ids=os.path.basename)
def test_every_benchmark_flag_has_help(script):
    options = _options(_help(script))
    assert "--json" in options, options
    bare = [flag for flag, text in options.items() if flag not in ("-h", "--help") and not text]
    assert bare == [], f"{os.path.basename(script)}: flags without help: {bare}"


def test_the_parser_reads_an_option_without_help_as_bare():
    """The check above can fail: an option with no help text reads as empty."""
    text = ("usage: x\n\noptions:\n  -h, --help  show this help message and exit\n"
            "  --steps STEPS\n  --json  print\n")
    assert _options(text) == {"-h": "show this help message and exit", "--steps": "", "--json": "print"}


def test_the_collectives_report_spells_microseconds_one_way():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import _report
    finally:
        sys.path.pop(0)
    assert _report._time(4.63e-05) == "46.3 µs" and _report._time(None) == "-"
    assert _report.fmt_bytes(4096) == "4 KiB" and _report.fmt_bytes(64 << 20) == "64 MiB"
    source = open(os.path.join(ROOT, "benchmarks", "_report.py"), encoding="utf-8").read()
    assert not re.search(r"\bus\b[\"')]", source)
