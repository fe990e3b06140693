"""Every fenced ``python`` and ``bash`` block of README.md and of every docs/*.md runs, in a test.

Collected with Sybil (its Markdown lexers and its ``skip`` directive), one test per document, so
that a document's blocks run in order whatever pytest-xdist does with the tests.

Conventions for whoever writes README.md or a page under docs/ (a new ``docs/*.md`` is picked up
without touching this file):

- A ```` ```python ```` block runs, and the blocks of one document run in order in one shared
  namespace: a later block may use the names an earlier one defined (``model``, ``x``, ``y``).
- A ```` ```python ```` block whose first line is a comment that is just a file name,
  ``# step.py``, is not run: it is written to that file in the document's working directory, for
  the commands after it (so it comes before the ``bash`` block that uses it).
- A ```` ```bash ```` block: each non-empty line that does not start with ``#`` is one command,
  run by ``bash``, and must exit 0 (a line ending in ``\\`` goes on on the next line; a trailing
  ``# comment`` is bash's own).  ``virtualpar`` and ``python`` on its PATH are this interpreter on
  this checkout (``PYTHONPATH`` puts the checkout first), and the interpreter's own bin folder
  follows (``mpiexec`` of the test extra's MPICH).  A line that starts with ``mpiexec`` runs only
  where mpiexec and mpi4py are installed (the test extra brings both); elsewhere it is left out
  with a warning.
- Working directory: one fresh temporary folder per document, shared by its python and bash
  blocks (python blocks run with it as the current directory), so files a block writes —
  ``trace.json``, ``step.py`` — land there, never in the checkout.
- ``<!-- skip: next -->`` on the line before a block (of any language) keeps it from running; a
  reason is a quoted string: ``<!-- skip: next "needs a GPU" -->``.  Use it for the install
  quickstart (CI, ``.ci/run``, runs that verbatim) and for what truly cannot run in a test.
- A block that is meant to fail is a python block that catches the expected error
  (``with pytest.raises(Deadlock): ...`` or ``try``/``except``), so it still runs.
- Hidden set-up code: Sybil's ``<!-- invisible-code-block: python ... -->``.
- Other languages (```` ```text ````, ```` ```console ````, none) are not run.

Cost: the README's blocks start a few small clusters and run the CLI a dozen times (each command
a fresh interpreter, ~1 s); about 30–60 s on two busy cores.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from unittest import SkipTest

import pytest

sybil = pytest.importorskip("sybil", reason="the test extra's sybil runs the documents' blocks")
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = [p for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))] if p.is_file()]
LINE_TIMEOUT = 300.0  # seconds one bash line may take before the test fails naming it
_FILE_BLOCK = re.compile(r"#\s*([\w.-]+\.py)\s*$")


def _environment(bin_dir: Path) -> dict[str, str]:
    """bash lines see this checkout: ``virtualpar`` and ``python`` run this interpreter on it."""
    for name, command in (("virtualpar", f'exec "{sys.executable}" -m virtualpar "$@"'),
                          ("python", f'exec "{sys.executable}" "$@"')):
        shim = bin_dir / name
        shim.write_text(f"#!/usr/bin/env bash\n{command}\n")
        shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["PATH"] = os.pathsep.join((str(bin_dir), os.path.dirname(sys.executable), env.get("PATH", "")))
    return env


def _commands(source: str) -> list[tuple[int, str]]:
    """(line offset within the block, command) for each command of a bash block."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for offset, line in enumerate(source.splitlines()):
        if pending is not None:
            start, text = pending
            text = text[:-1] + line.strip()
            pending = (start, text) if text.endswith("\\") else None
            if pending is None:
                out.append((start, text))
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending = (offset, stripped)
        else:
            out.append((offset, stripped))
    if pending is not None:
        out.append(pending)
    return out


def _bash_evaluator(env: dict[str, str]):
    def evaluate(example) -> None:
        for offset, command in _commands(str(example.parsed)):
            if command.split()[0] == "mpiexec" and not _have_mpi(env):
                warnings.warn(f"{_location(example)}: `{command}` not run: it needs mpiexec and mpi4py "
                              "(the test extra's mpich and mpi4py)", stacklevel=1)
                continue
            try:
                done = subprocess.run(["bash", "-c", command], cwd=os.getcwd(), env=env, capture_output=True,
                                      text=True, timeout=LINE_TIMEOUT, stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"line {example.line + offset + 1}: `{command}` took more than "
                                     f"{LINE_TIMEOUT:.0f} s") from None
            if done.returncode != 0:
                raise AssertionError(
                    f"line {example.line + offset + 1}: `{command}` exited {done.returncode}\n"
                    f"--- stdout ---\n{done.stdout[-3000:]}\n--- stderr ---\n{done.stderr[-3000:]}")
    return evaluate


def _have_mpi(env: dict[str, str]) -> bool:
    mpiexec = shutil.which("mpiexec", path=env["PATH"])
    return mpiexec is not None and importlib.util.find_spec("mpi4py") is not None


def _write_file(example) -> None:
    """A ``# NAME.py`` block: written to NAME.py in the current (the document's) directory."""
    source = str(example.parsed)
    name = _FILE_BLOCK.match(source.splitlines()[0]).group(1)
    Path(name).write_text(source)


def _python_blocks(document):
    """Sybil's python code blocks, with file blocks (``# step.py``) written instead of run."""
    for region in PythonCodeBlockParser()(document):
        parsed = region.parsed
        if isinstance(parsed, str) and parsed.strip() and _FILE_BLOCK.match(parsed.splitlines()[0]):
            region.evaluator = _write_file
        yield region


def _parsers(bin_dir: Path) -> list:
    """Sybil's skip directive, python blocks (file blocks written), bash blocks line by line."""
    return [SkipParser(), _python_blocks, CodeBlockParser("bash", _bash_evaluator(_environment(bin_dir)))]


def _location(example) -> str:
    return f"{Path(example.path).relative_to(REPO)}, line {example.line}"


@pytest.mark.timeout(900)  # a whole document: each of its bash lines has LINE_TIMEOUT of its own
@pytest.mark.parametrize("path", DOCUMENTS, ids=[str(p.relative_to(REPO)) for p in DOCUMENTS])
def test_every_block_of_the_document_runs(path: Path, tmp_path: Path, monkeypatch):
    (tmp_path / "bin").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    parsers = _parsers(tmp_path / "bin")
    document = sybil.Sybil(parsers=parsers, path=str(REPO)).parse(path)
    ran = skipped = 0
    for example in document:
        try:
            example.evaluate()
        except SkipTest:
            skipped += 1
            continue
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise AssertionError(f"the block at {_location(example)} failed: {type(exc).__name__}: {exc}") \
                from exc
        finally:
            os.chdir(work)  # a block that changed directory does not move the next one
        ran += 1
    runnable = re.search(r"^```(python|bash)\s*$", path.read_text(encoding="utf-8"), re.M)
    assert ran > 0 or skipped > 0 or not runnable, f"{path}: no block found"


def test_bash_lines_are_commands_and_continuations_join():
    block = textwrap.dedent("""\
        # a comment line is not a command
        virtualpar schedule gpipe      # a trailing comment is bash's

        virtualpar run step.py:step \\
            --mesh dp=2,tp=2
        """)
    assert _commands(block) == [(1, "virtualpar schedule gpipe      # a trailing comment is bash's"),
                                (3, "virtualpar run step.py:step --mesh dp=2,tp=2")]


def test_a_failing_command_and_a_skipped_block_are_seen(tmp_path, monkeypatch):
    """The collector cannot pass vacuously: a command that exits 1 fails the document, and a block
    after ``skip: next`` does not run."""
    doc = tmp_path / "page.md"
    doc.write_text(textwrap.dedent("""\
        ```python
        ran = ["first"]
        ```

        <!-- skip: next "this would fail" -->
        ```python
        raise RuntimeError("skipped blocks do not run")
        ```

        ```python
        ran.append("third")
        ```

        ```bash
        true
        python -c "import sys; sys.exit(3)"
        ```
        """))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bin").mkdir()
    parsers = _parsers(tmp_path / "bin")
    document = sybil.Sybil(parsers=parsers, path=str(tmp_path)).parse(doc)
    outcomes = []
    for example in document:
        try:
            example.evaluate()
            outcomes.append("ran")
        except SkipTest:
            outcomes.append("skipped")
        except AssertionError as exc:
            outcomes.append(str(exc).splitlines()[0])
    assert outcomes[:4] == ["ran", "ran", "skipped", "ran"]  # the skip directive itself is an example
    assert outcomes[4] == 'line 16: `python -c "import sys; sys.exit(3)"` exited 3'
    assert document.namespace["ran"] == ["first", "third"]


def test_a_file_block_is_written_for_the_commands_after_it(tmp_path, monkeypatch):
    doc = tmp_path / "page.md"
    doc.write_text(textwrap.dedent("""\
        ```python
        # step.py
        def step(dev):
            return dev.rank
        ```

        ```bash
        virtualpar run step.py:step -n 2
        ```
        """))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bin").mkdir()
    parsers = _parsers(tmp_path / "bin")
    for example in sybil.Sybil(parsers=parsers, path=str(tmp_path)).parse(doc):
        example.evaluate()
    assert (tmp_path / "step.py").read_text().startswith("# step.py\ndef step(dev):")
