"""The README's tensor-parallel worked example runs and prints what its comments say."""

from __future__ import annotations

import contextlib
import io
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_worked_example_runs_as_documented():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text[text.index("## Tensor parallelism: sharding policies"):]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    lines = out.getvalue().splitlines()
    assert lines == [
        "matched_inner: A[R, S(x,y)] @ B[S(x,y), R] -> C[R, R]",
        "fwd all_reduce(x,y) | bwd -",
        "True 393216",
        "True True",
        "('all_reduce',) () 8388608.0 16777216.0",
    ]
