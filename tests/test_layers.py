"""The house reads top-down: each layer imports only the layers below it, and no module imports itself back
through a circle. Imports inside functions count too (they run as soon as the function does)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what each top-level package may import (besides itself): the core at the bottom, the CLI at the top
ALLOWED = {
    "regis": set(),
    "indexer": {"regis"},
    "training": {"regis"},
    "service": {"regis", "indexer"},
    "cluster": {"regis", "indexer", "service"},
    "cli": {"regis", "indexer", "service", "training", "cluster"},
}


def _modules(package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(path: Path, module: str) -> set[str]:
    """Every module named by an import statement of ``path``, anywhere in it, relative imports resolved."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: -node.level] if path.name != "__init__.py" else module.split(".")
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_each_layer_imports_only_the_layers_below():
    wrong = []
    for package, allowed in ALLOWED.items():
        for module, path in _modules(package).items():
            for name in _imports(path, module):
                top = name.split(".")[0]
                if top in ALLOWED and top != package and top not in allowed:
                    wrong.append(f"{module} imports {name}")
    assert not wrong, "imports that run upwards:\n" + "\n".join(wrong)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles_between_modules():
    modules = {}
    for package in ALLOWED:
        modules.update(_modules(package))
    graph = {}
    for module, path in modules.items():
        # an import of a package's __init__ is an edge too, but a module importing its own package's
        # __init__ (for a re-export) is not a circle of modules
        graph[module] = {name for name in _imports(path, module) if name in modules and name != module
                         and not module.startswith(name + ".")}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_see_a_cycle_and_a_lazy_upward_import(tmp_path):
    """The checks above fail on a circle and on an import inside a function (they cannot pass vacuously)."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    lazy = tmp_path / "build.py"
    lazy.write_text("def f():\n    from cluster.cli import build_ray_cli\n    from . import scan\n")
    assert {"cluster.cli.build_ray_cli", "indexer.scan"} <= _imports(lazy, "indexer.build")
