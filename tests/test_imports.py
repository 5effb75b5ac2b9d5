"""Import structure of the package, read from the source (ast), imports inside functions included.

- No import cycle between modules.
- The engine stands alone: importing any module of ``specviz.engine`` reaches (transitively, within specviz) nothing
  from the drafters, the UI, the views, the benchmark, training, the API or the CLI.

``../shared/tools/import_graph.py specviz`` reports the same two things from the command line.

Edges: ``import a.b.c`` and ``from a.b import c`` run ``a``, ``a.b`` and ``a.b.c`` (when ``c`` is a module, else
``a.b``), so a module depends on each of those, except on its own ancestor packages, which are always initialised
before it. A name taken from an ancestor package's ``__init__`` (``from specviz.models import load_model`` inside
``specviz.models.hub``) is an explicit edge like any other. ``if TYPE_CHECKING:`` imports count too (as in the tool).
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "specviz"
ENGINE = f"{PACKAGE}.engine"
ENGINE_MUST_NOT_REACH = tuple(f"{PACKAGE}.{name}" for name in
                              ("drafters", "ui", "viz", "bench", "training", "api", "cli"))


def find_modules(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``) for every .py file under ``root / package``."""
    modules = {}
    for file in sorted((root / package).rglob("*.py")):
        parts = list(file.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        modules[".".join(parts)] = (file, is_package)
    return modules


def ancestors(name: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b"]``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imported_modules(module: str, file: Path, is_package: bool, modules: dict) -> set[str]:
    """The package's modules that ``module`` names in any import statement (resolved to existing modules)."""
    here = module.split(".") if is_package else module.split(".")[:-1]

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    targets: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here[:len(here) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            # ``from base import x``: the submodule ``base.x`` when there is one, else ``base`` itself
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for name in names:
            target = resolve(name)
            if target is None or not (target == PACKAGE or target.startswith(PACKAGE + ".")):
                continue
            own = set(ancestors(module))
            targets.update(a for a in ancestors(target) if a not in own)  # running ``target`` runs its packages
            targets.add(target)
    targets.discard(module)
    return targets


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> nx.DiGraph:
    modules = find_modules(root, package)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, (file, is_package) in modules.items():
        graph.add_edges_from((module, target) for target in imported_modules(module, file, is_package, modules))
    return graph


def cycles(graph: nx.DiGraph) -> list[list[str]]:
    """Import cycles as loops ``a -> b -> ... -> a``: for every import inside a strongly connected component, the
    shortest loop through it (so two cycles that share a module are both listed), each starting at its smallest name.
    """
    found = set()
    for component in nx.strongly_connected_components(graph):
        if len(component) < 2:
            continue
        inside = graph.subgraph(component)
        for source, target in inside.edges:
            loop = [source, *nx.shortest_path(inside, target, source)[:-1]]
            first = loop.index(min(loop))
            found.add(tuple(loop[first:] + loop[:first]))
    return sorted([*loop, loop[0]] for loop in found)


def forbidden_reaches(graph: nx.DiGraph, sources: list[str], forbidden: tuple[str, ...]) -> list[list[str]]:
    """For each module under ``forbidden`` that ``sources`` reach, the import chain that gets there."""
    start = set(sources) | {a for s in sources for a in ancestors(s)}  # importing a module runs its packages
    came_from: dict[str, str | None] = {s: None for s in start}
    queue = deque(sorted(start))
    while queue:
        module = queue.popleft()
        for target in sorted(graph.successors(module)):
            if target not in came_from:
                came_from[target] = module
                queue.append(target)
    chains = []
    for module in sorted(came_from):
        if any(module == f or module.startswith(f + ".") for f in forbidden):
            chain, step = [], module
            while step is not None:
                chain.append(step)
                step = came_from[step]
            chains.append(chain[::-1])
    return chains


def engine_modules(graph: nx.DiGraph) -> list[str]:
    return sorted(m for m in graph if m == ENGINE or m.startswith(ENGINE + "."))


# --- the package ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    return import_graph()


def test_the_walk_sees_the_package(graph):
    assert len(engine_modules(graph)) > 5 and f"{PACKAGE}.cli" in graph
    assert graph.number_of_edges() > len(graph)  # sanity: imports were found


def test_no_import_cycles(graph):
    found = cycles(graph)
    assert not found, "import cycles between modules:\n" + "\n".join(" -> ".join(c) for c in found)


def test_engine_imports_nothing_from_the_layers_above_it(graph):
    chains = forbidden_reaches(graph, engine_modules(graph), ENGINE_MUST_NOT_REACH)
    assert not chains, ("specviz.engine reaches modules it must not import (import chains):\n"
                        + "\n".join(" -> ".join(c) for c in chains))


# --- the walker itself, on a made-up package -----------------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_walker_finds_cycles_through_function_imports_and_relative_imports(tmp_path):
    _write(tmp_path, {
        "specviz/__init__.py": "",
        "specviz/engine/__init__.py": "",
        "specviz/engine/loop.py": "from .helpers import f\n",
        "specviz/engine/helpers.py": "def f():\n    from specviz.ui import app\n",
        "specviz/ui/__init__.py": "",
        "specviz/ui/app.py": "import specviz.engine.loop\n",
        "specviz/models/__init__.py": "from specviz.models.loader import load\n",
        "specviz/models/loader.py": "from specviz.models import memory\nimport torch\n\ndef load():\n    pass\n",
        "specviz/models/memory.py": "",
    })
    graph = import_graph(tmp_path, "specviz")
    assert cycles(graph) == [["specviz.engine.helpers", "specviz.ui.app", "specviz.engine.loop",
                              "specviz.engine.helpers"]]
    chains = forbidden_reaches(graph, engine_modules(graph), ENGINE_MUST_NOT_REACH)
    assert ["specviz.engine.helpers", "specviz.ui"] in chains
    assert ["specviz.engine.helpers", "specviz.ui.app"] in chains
    # a package __init__ re-exporting a child that imports a sibling submodule is not a cycle
    assert graph.has_edge("specviz.models.loader", "specviz.models.memory")
    assert not graph.has_edge("specviz.models.loader", "specviz.models")


def test_walker_counts_names_taken_from_an_ancestor_init(tmp_path):
    _write(tmp_path, {
        "specviz/__init__.py": "",
        "specviz/models/__init__.py": "from specviz.models.hub import fetch\n\ndef load_model():\n    pass\n",
        "specviz/models/hub.py": "def fetch():\n    from specviz.models import load_model\n",
    })
    assert cycles(import_graph(tmp_path, "specviz")) == [["specviz.models", "specviz.models.hub", "specviz.models"]]
