"""Imports run one way between andrea_exp's subpackages: each subpackage's docstring says which others it may
import (a line `May import: a, b.`), and every import in its modules, at any depth (lazy ones included), keeps
to it; the stated rules themselves form no circle, and no two modules need each other to load (an import inside
a function, taken only when it runs, may point back within a subpackage: data.sources reads a prepared
directory's tokenizer through data.prepare, model.step_stats loads its Triton kernels only on CUDA).
The top-level modules (andrea_exp/*.py, the entry points) stand above all of it: nothing imports them back."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import andrea_exp

PACKAGE = Path(andrea_exp.__file__).resolve().parent
SUBPACKAGES = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file() and p.name != "conf")


def allowed(sub: str) -> set[str]:
    """The subpackages `sub` may import, as its docstring states them."""
    doc = ast.get_docstring(ast.parse((PACKAGE / sub / "__init__.py").read_text())) or ""
    found = re.search(r"^May import: (.*?)\.?$", doc, re.M)
    assert found, f"andrea_exp/{sub}/__init__.py's docstring lacks a line 'May import: ...'"
    text = found.group(1)
    return set() if text.startswith("nothing") else {name.strip() for name in text.split(",")}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, at_load: bool = False) -> set[str]:
    """The andrea_exp modules a file imports (dotted names; `from andrea_exp.x import y` counts x.y where y is a
    module, x otherwise). at_load: only the imports that run when the module loads (not inside a function)."""
    found = set()
    tree = ast.parse(path.read_text())
    nodes = [n for top in tree.body for n in ast.walk(top) if not isinstance(top, (ast.FunctionDef, ast.ClassDef))] \
        if at_load else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("andrea_exp"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("andrea_exp"))
    return found


FILES = sorted(PACKAGE.rglob("*.py"))
MODULES = {module_name(path): path for path in FILES if "conf" not in path.relative_to(PACKAGE).parts}


def subpackage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in SUBPACKAGES else None


def test_every_import_keeps_to_the_stated_order():
    wrong = []
    for module, path in MODULES.items():
        sub = subpackage(module)
        if sub is None:  # andrea_exp/*.py: the package's face and the entry modules, above every subpackage
            continue
        for target in imported(path):
            other = subpackage(target)
            if other is not None and other != sub and other not in allowed(sub):
                wrong.append(f"{module} imports {target} ({sub} may import: {sorted(allowed(sub))})")
    assert not wrong, "\n".join(wrong)


TOP_LEVEL = {module for module, path in MODULES.items() if path.parent == PACKAGE and path.name != "__init__.py"}


def imports_of_top_level(modules: dict[str, Path]) -> list[str]:
    """Each import, at any depth, of a top-level module (andrea_exp/*.py: the entry modules) by another module."""
    return [f"{module} imports {target}" for module, path in modules.items() for target in imported(path)
            if target in TOP_LEVEL and target != module]


def test_top_level_modules_stand_above_every_subpackage():
    """andrea_exp/*.py only hand a command on to a subpackage: nothing imports them back (an import of an entry
    module from below would make a circle through it), and the package's face imports nothing at all."""
    assert {"andrea_exp.__main__", "andrea_exp.corpora", "andrea_exp.prepare"} <= TOP_LEVEL
    wrong = imports_of_top_level(MODULES)
    assert not wrong, "\n".join(wrong)
    assert imported(PACKAGE / "__init__.py") == set(), "andrea_exp/__init__.py must stay free of imports"
    for module in TOP_LEVEL:
        assert all(subpackage(t) for t in imported(MODULES[module])), f"{module} imports outside a subpackage"


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph, as the list of its nodes, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node], _ = 1, stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node], _ = 2, stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_stated_order_has_no_circle():
    rules = {sub: allowed(sub) for sub in SUBPACKAGES}
    for sub, others in rules.items():
        assert others <= set(SUBPACKAGES), f"{sub} names unknown subpackages: {sorted(others - set(SUBPACKAGES))}"
    assert cycle(rules) is None, f"the stated order runs in a circle: {' -> '.join(cycle(rules))}"


def test_no_two_modules_need_each_other_to_load():
    graph = {module: {t for t in imported(path, at_load=True) if t in MODULES and t not in (module, "andrea_exp")}
             for module, path in MODULES.items()}
    for module in graph:  # a package's __init__ runs before its modules: an import of it is not a dependency circle
        graph[module] = {t for t in graph[module] if MODULES[t].name != "__init__.py"}
    found = cycle(graph)
    assert found is None, f"modules import one another in a circle: {' -> '.join(found)}"


def test_the_checker_sees_a_wrong_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from andrea_exp.launch import cli\n\ndef f():\n    from andrea_exp.runs import rundir\n")
    assert imported(bad) == {"andrea_exp.launch.cli", "andrea_exp.runs.rundir"}
    assert imported(bad, at_load=True) == {"andrea_exp.launch.cli"}
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
    back = tmp_path / "back.py"
    back.write_text("def f():\n    from andrea_exp.__main__ import main\n")
    assert imports_of_top_level({"andrea_exp.launch.x": back}) == ["andrea_exp.launch.x imports andrea_exp.__main__"]
