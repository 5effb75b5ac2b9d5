"""The package installs on its own: ``pip install .`` ships every file specviz reads, and nothing outside it.

What an installed specviz reads beside its code (the shipped drafters, the CSS, the example prompts and traces, the
thin kernel's C source) must be in ``pyproject.toml``'s package data, or the wheel silently leaves it out; paths are
found from the package (``specviz.resources``), never from the checkout around it; ``tools/`` is not installed, so
the package must not import it; and the dependency list is the one the Space installs (``requirements.txt``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from specviz import resources

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specviz"
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirements() -> list[str]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return [re.sub(r"\s+", "", line.split("#")[0]) for line in lines if line.split("#")[0].strip()]


def test_the_dependencies_are_the_requirements(pyproject):
    assert [re.sub(r"\s+", "", d) for d in pyproject["project"]["dependencies"]] == _requirements()


def test_the_console_script_is_the_cli(pyproject):
    from specviz import cli

    assert pyproject["project"]["scripts"] == {"specviz": "specviz.cli:main"} and callable(cli.main)


def test_every_data_file_in_the_package_is_package_data(pyproject):
    data = pyproject["tool"]["setuptools"]["package-data"]
    shipped = {path for package, patterns in data.items() for pattern in patterns
               for path in (ROOT / package.replace(".", "/")).glob(pattern) if path.is_file()}
    present = {path for path in PACKAGE.rglob("*") if path.is_file() and path.suffix not in (".py", ".pyc")
               and "__pycache__" not in path.parts}
    assert present - shipped == set(), "files in specviz/ a wheel would leave out"
    for name in ("smollm2-135m-draft", "smollm2-135m-eagle3"):
        assert (resources.MODELS / name / "config.json").is_file()
    assert resources.CSS.is_file() and (resources.EXAMPLES / "prompts.jsonl").is_file()
    assert next((resources.EXAMPLES / "traces").glob("*.jsonl"), None) is not None


def _imports(file: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
    return names


def test_the_package_stands_alone():
    """No module imports the development tooling, or finds files by climbing out of the package."""
    for file in PACKAGE.rglob("*.py"):
        text = file.read_text()
        assert not any(name == "tools" or name.startswith("tools.") for name in _imports(file)), file
        climbs = [line for line in text.splitlines() if "__file__" in line and ".parent" in line]
        assert not climbs, f"{file}: {climbs[:1]} (find shipped files through specviz.resources)"
