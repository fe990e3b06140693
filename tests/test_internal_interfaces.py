"""The device's parts, and the endpoint's collaborators, reach each other through narrow objects,
never through another object's private fields (read from the source; no process started).

A device's parts (point-to-point, probing, requests, group communication, collectives, self-sends,
warm-up, start line) share one :class:`~virtualpar.runtime.core.DeviceCore`, passed explicitly;
the endpoint's collaborators (matching, wildcard receives, rendezvous, waiting, the end-of-run
report) use its ``MatchQueues``, its ``RendezvousState`` and its public names.  A private field
(``x._name``) may be read on ``self`` or ``cls`` only, apart from the few handles listed here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "virtualpar"
PARTS = [f"runtime/{m}.py" for m in ("core", "device", "p2p", "probing", "requests", "group_comm",
                                    "collective_call", "collective_spec", "loopback", "warmup", "start_line")]
PARTS += [f"transport/{m}.py" for m in ("endpoint", "receiving", "sending", "matching", "wildcard",
                                        "rendezvous", "leftovers", "waiting", "want_room", "channel",
                                        "requests")]
# (variable, private name): the device's handle on its core, and its cache of resolved groups; and
# ``wait_any``'s check that a request is this device's (a Request keeps its core, unshown to users)
ALLOWED = {("dev", "_core"), ("dev", "_group"), ("r", "_core")}


def _private_reaches(source: str, name: str) -> list[str]:
    tree = ast.parse(source, name)
    modules = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
               for a in n.names}  # os._exit is a module's function, not an object's field
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        owner = node.value.id if isinstance(node.value, ast.Name) else None
        if owner in ("self", "cls") or owner in modules or (owner, node.attr) in ALLOWED:
            continue
        out.append((node.lineno, f"{name}:{node.lineno} reads {ast.unparse(node)}"))
    return [text for _, text in sorted(out)]


def test_the_checker_sees_a_private_reach():
    """The checker itself: a test that cannot fail is a defect."""
    source = "import os\ndef f(dev, self):\n    dev._core.clock\n    self._x\n    dev._endpoint.wait()\n" \
        "    self._dev._clock\n    os._exit(0)\n"
    assert _private_reaches(source, "probe.py") == ["probe.py:5 reads dev._endpoint",
                                                    "probe.py:6 reads self._dev._clock"]


@pytest.mark.parametrize("part", PARTS)
def test_no_part_reads_another_objects_private_fields(part):
    path = ROOT / part
    assert path.exists(), part
    found = _private_reaches(path.read_text(), part)
    assert not found, "\n".join(found)
