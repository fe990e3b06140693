"""The import graph's direction, read from the source (no process started).

The layers above the runtime (nn, sharding, ops, tensor_parallel, pipeline, strategies, timeline,
parallel, checkpoint) stand on the Device protocol: they import nothing from ``runtime``,
``transport``, ``commands`` or the CLI — function-local imports included — and do not take the
runtime's names (``VirtualCluster``, ``VirtualDevice``, ...) from the package root either.  Tours,
demos and anything that starts a cluster for a user live under ``commands/``; ``labs/`` (which
brings a cluster and an operation together, like the commands) is not checked here.  The runtime in turn runs
any operation through ``virtualpar.executable`` and imports none of those layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "virtualpar"
UPPER = ("nn", "sharding", "ops", "tensor_parallel", "pipeline", "strategies", "timeline", "parallel",
         "checkpoint")
FORBIDDEN = ("runtime", "transport", "commands", "cli")
ROOT_RUNTIME_NAMES = {"VirtualCluster", "VirtualDevice", "VirtualChannel", "Status", "ANY_SOURCE",
                      "ANY_TAG"}


def _imports(source: str, rel: str) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, absolute module, names imported from it) for every import of the module at ``rel``
    (its path under virtualpar/), nested ones included."""
    package = ["virtualpar", *Path(rel).parent.parts]
    out = []
    for node in ast.walk(ast.parse(source, rel)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out.append((node.lineno, module, tuple(a.name for a in node.names)))
    return sorted(out)


def _offences(path: Path, forbidden_layers: tuple[str, ...], root_names: set[str],
              source: str | None = None) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    bad = []
    for line, module, names in _imports(path.read_text() if source is None else source, rel):
        parts = module.split(".")
        targets = [parts] + [parts + [n] for n in names]  # "from .. import commands" names the package
        for t in targets:
            if len(t) > 1 and t[0] == "virtualpar" and t[1] in forbidden_layers:
                bad.append(f"{rel}:{line} imports {'.'.join(t)}")
                break
        if module == "virtualpar" and set(names) & root_names:
            bad.append(f"{rel}:{line} takes {sorted(set(names) & root_names)} from the package root")
    return bad


def test_the_import_walker_sees_relative_and_nested_imports():
    """The checker itself: a test that cannot fail is a defect."""
    probe = ROOT / "sharding" / "_probe_for_test_layering.py"  # never written: its source is given
    source = "def f():\n    from ..runtime import cluster\n    from .. import VirtualCluster\n" \
        "import virtualpar.transport.shm\nfrom .spec import bounds\n"
    found = _offences(probe, FORBIDDEN, ROOT_RUNTIME_NAMES, source)
    assert found == ["sharding/_probe_for_test_layering.py:2 imports virtualpar.runtime",
                     "sharding/_probe_for_test_layering.py:3 takes ['VirtualCluster'] from the package root",
                     "sharding/_probe_for_test_layering.py:4 imports virtualpar.transport.shm"]


@pytest.mark.parametrize("layer", UPPER)
def test_upper_layers_import_nothing_from_the_runtime_transport_or_cli(layer):
    files = sorted((ROOT / layer).rglob("*.py"))
    assert files, f"no modules under {layer}/"
    bad = [o for f in files for o in _offences(f, FORBIDDEN, ROOT_RUNTIME_NAMES)]
    assert not bad, "\n".join(bad)


def test_the_runtime_imports_none_of_the_layers_above_it():
    bad = [o for f in sorted((ROOT / "runtime").rglob("*.py")) for o in _offences(f, UPPER, set())]
    assert not bad, "\n".join(bad)
