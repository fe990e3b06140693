"""No import circles in ``virtualpar``, read from the source (no module is imported).

The graph has one node per module (a package is its ``__init__``) and an edge from a module to each
module of ours it imports: at module level *and* inside functions (a function-local import that
closes a circle is a circle all the same, merely deferred), but not under ``if TYPE_CHECKING:``
(those exist only for the type checker).  ``from pkg import name`` points at ``pkg.name`` when that
is a module, else at ``pkg``; importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``, so
it points at those too (except the importer's own packages, which are running already).  Every
strongly connected component of more than one module is a circle.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent / "virtualpar"

# Circles allowed to remain: none (the trace views and the diagram renderers import the types they
# are handed only for type checking).  Listing one here would let it stay; then also test that it
# still exists, so that it comes off the list once broken.
KNOWN_CIRCLES: list[set[str]] = []


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(tree: ast.AST, package: list[str]) -> list[str]:
    """Absolute names of what ``tree`` imports, anywhere but under ``if TYPE_CHECKING:`` (its
    ``else:`` counts); ``package``: the importing module's package, for relative imports."""
    out: list[str] = []
    stack = [tree]
    while stack:
        for node in ast.iter_child_nodes(stack.pop()):
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                stack.extend(node.orelse)
                continue
            if isinstance(node, ast.Import):
                out += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                out += [f"{module}.{a.name}" for a in node.names]  # a module, or a name defined in ``module``
            stack.append(node)
    return out


def import_graph(root: Path = ROOT, sources: dict[str, str] | None = None) -> nx.DiGraph:
    """The import graph of the package at ``root`` (``sources``: module name -> source, in place of
    the files, for testing this function)."""
    if sources is None:
        paths = {_module_name(p, root): p for p in root.rglob("*.py")}
        sources = {name: p.read_text() for name, p in paths.items()}
        packages = {name for name, p in paths.items() if p.name == "__init__.py"}
    else:
        packages = {name for name in sources if any(other.startswith(name + ".") for other in sources)}
    graph = nx.DiGraph()
    for name, source in sources.items():
        graph.add_node(name)
        package = name.split(".") if name in packages else name.split(".")[:-1]
        running = {".".join(package[:i]) for i in range(1, len(package) + 1)}  # our own packages
        for target in _imported(ast.parse(source, name), package):
            while target and target not in sources:  # ``from m import f``: f is no module, m is
                target = target.rpartition(".")[0]
            parts = target.split(".") if target else []
            for i in range(1, len(parts) + 1):  # the target and the packages its import runs first
                t = ".".join(parts[:i])
                if t in sources and t != name and (t == target or t not in running):
                    graph.add_edge(name, t)
    return graph


@functools.cache
def _package_graph() -> nx.DiGraph:
    return import_graph()


def circles(graph: nx.DiGraph) -> list[set[str]]:
    return sorted((c for c in nx.strongly_connected_components(graph) if len(c) > 1), key=sorted)


def _describe(circle: set[str], graph: nx.DiGraph) -> str:
    cycle = nx.find_cycle(graph.subgraph(circle))
    return " -> ".join([a for a, _ in cycle] + [cycle[0][0]])


def test_the_graph_sees_function_local_imports_and_skips_type_checking_ones():
    """The checker itself: a test that cannot fail is a defect."""
    sources = {
        "pkg": "from .a import f\n",
        "pkg.a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import g\n"
                 "def f():\n    pass\n",
        "pkg.b": "from .a import f\n",
        "pkg.c": "def h():\n    from . import d\n",
        "pkg.d": "import pkg.c\n",
        "pkg.e": "from pkg.sub.x import y\n",
        "pkg.sub": "from .. import e\n",
        "pkg.sub.x": "y = 1\n",
    }
    graph = import_graph(sources=sources)
    assert graph.has_edge("pkg.b", "pkg.a") and not graph.has_edge("pkg.a", "pkg.b")  # TYPE_CHECKING only
    assert graph.has_edge("pkg.e", "pkg.sub.x")
    assert graph.has_edge("pkg.e", "pkg.sub")  # importing pkg.sub.x runs pkg/sub/__init__ first
    assert not graph.has_edge("pkg.a", "pkg")  # (the importer's own package is running already)
    assert circles(graph) == [{"pkg.c", "pkg.d"}, {"pkg.e", "pkg.sub"}]


def test_the_graph_covers_the_package():
    graph = _package_graph()
    assert graph.has_edge("virtualpar.runtime.device", "virtualpar.runtime.core")
    assert graph.has_edge("virtualpar.runtime.core", "virtualpar.transport.channel")
    assert graph.number_of_nodes() > 100


def test_no_import_circles_beyond_the_known_ones():
    graph = _package_graph()
    found = circles(graph)
    new = [c for c in found if c not in KNOWN_CIRCLES]
    assert not new, "import circles:\n" + "\n".join(_describe(c, graph) for c in new)
