"""docs/architecture.md's import rules, read off the source: imports point one way between the
stages, and no module imports itself back through others (no circle, lazy imports included)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from conftest import REPO

SRC = REPO / "src"
# Lowest first: a module imports its own folder and the layers below it, never its own layer's
# other folders nor one above. `perfswarm` (the package: its version, the lazy API names) is
# importable from anywhere. workloads/ (bundled programs) imports no perfswarm at all.
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(names.split()) for names in (
    "errors shown defaults", "trace", "userfiles analyze", "model", "recorder report", "optimize",
    "arguments", "api", "cli"))


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported(tree: ast.AST, modules: set[str]) -> Iterator[str]:
    """The perfswarm modules a file imports, at the top or inside functions; imports only for
    the type checker are not imports."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            yield from (n for child in node.orelse for n in imported(child, modules))
            continue
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "perfswarm")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "perfswarm":
            yield node.module
            # `from perfswarm.x import y` imports module perfswarm.x.y when there is one
            yield from (f"{node.module}.{a.name}" for a in node.names
                        if f"{node.module}.{a.name}" in modules)
        yield from imported(node, modules)


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in (SRC / "perfswarm").rglob("*.py")}
    modules = set(files)
    return {name: {m for m in imported(ast.parse(path.read_text(encoding="utf-8")), modules)
                   if m in modules and m != name}
            for name, path in files.items()}


def folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer(module: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if folder(module) in names)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circles() -> None:
    assert circles(import_graph()) == []


def test_circles_are_found() -> None:
    """The check itself: a circle through three modules, and one through a lazy import."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    tree = ast.parse("def f():\n    from perfswarm.x import y\n")
    assert list(imported(tree, {"perfswarm.x", "perfswarm.x.y"})) == ["perfswarm.x",
                                                                      "perfswarm.x.y"]


def test_imports_point_down_the_layers() -> None:
    wrong = sorted(f"{a} imports {b}" for a, targets in import_graph().items()
                   for b in targets if folder(a) != folder(b) and b != "perfswarm"
                   and (folder(a) == "workloads" or layer(b) >= layer(a)))
    assert wrong == []


def test_model_runs_nothing() -> None:
    """model/ holds fitted models and pure math: no torch, no processes, no recorder."""
    for path in (SRC / "perfswarm" / "model").rglob("*.py"):
        names = {n for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 for n in ([a.name for a in node.names] if isinstance(node, ast.Import) else
                           [node.module or ""] if isinstance(node, ast.ImportFrom) else [])}
        roots = {n.split(".")[0] for n in names}
        assert not roots & {"torch", "subprocess", "multiprocessing"}, path
        assert not any(n.startswith("perfswarm.recorder") for n in names), path


# A tuned command's own failure speaks of the tuner's `--measure stdout` (CommandFailed is no
# ParameterError yet); a tuning space's `flag` field is the tuned program's flag (--num-workers),
# not perfswarm's.
FLAG_IN_MESSAGE_ALLOWED = {"perfswarm.optimize.trial", "perfswarm.optimize.space"}


def test_library_errors_name_no_flags() -> None:
    """Outside cli/, what a `raise` says names parameters (ParameterError), never `--flags`:
    the CLI maps them to its flags (errors.flag)."""
    flagged = []
    for path in (SRC / "perfswarm").rglob("*.py"):
        name = module_name(path)
        if folder(name) in ("cli", "workloads") or name in FLAG_IN_MESSAGE_ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                texts = [c.value for c in ast.walk(node.exc)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str)]
                if any(re.search(r"(^|\s|\()--[a-z]", t) for t in texts):
                    flagged.append(f"{name}:{node.lineno}")
    assert flagged == []
