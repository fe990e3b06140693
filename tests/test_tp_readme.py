"""The tensor-parallel page's worked example (docs/tensor-parallel.md) runs and prints what the
page says it prints."""

from __future__ import annotations

import contextlib
import io
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_worked_example_runs_as_documented(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = open(os.path.join(ROOT, "docs", "tensor-parallel.md"), encoding="utf-8").read()
    head, section = text.split("## A worked example: `matched_inner`", 1)
    namespace = {"__name__": "tp_docs"}
    with contextlib.redirect_stdout(io.StringIO()):  # the page's earlier blocks set up mesh and imports
        for block in re.findall(r"```python\n(.*?)```", head, re.S):
            exec(compile(block, "docs/tensor-parallel.md", "exec"), namespace)
    code, shown = re.search(r"```python\n(.*?)```\s*```text\n(.*?)```", section, re.S).groups()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/tensor-parallel.md", "exec"), namespace)
    lines = out.getvalue().splitlines()
    assert lines[0] == "fwd all_reduce(x,y) | bwd -"
    assert lines[1:] == shown.strip().splitlines()
