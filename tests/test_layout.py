"""The package's layout rules, read from the code's own imports (ast, nothing run).

- no folder of `zbkit/` holds more than 15 modules;
- imports run one way: no circle among zbkit's modules, counting imports inside functions;
  an import inside a function says why on its line or the line above (it keeps `import
  zbkit` fast, torch out of a pure-Python package, or an optional extra optional);
- no module takes another folder's private names (`_name`, or a module `_name`); the
  folders that hold it (its own, zbkit's root) share theirs with it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1] / "zbkit"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _resolve(name: str, imported: str | None) -> str | None:
    """The zbkit module an import reaches: `from a.b import c` is a.b.c when that is a
    module, else a.b."""
    if imported and f"{name}.{imported}" in MODULES:
        return f"{name}.{imported}"
    return name if name in MODULES else None


def _imports(path: Path) -> list[tuple[str, str | None, bool, int]]:
    """(module, name taken or None, whether inside a function, line) of each zbkit import."""
    tree = ast.parse(path.read_text())
    out = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            deeper = inside or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # never run
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.startswith("zbkit"):
                        out.append((alias.name, None, deeper, child.lineno))
            elif isinstance(child, ast.ImportFrom) and (child.module or "").startswith("zbkit"):
                for alias in child.names:
                    out.append((child.module, alias.name, deeper, child.lineno))
            visit(child, deeper)

    visit(tree, False)
    return out


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        for module, taken, _, _ in _imports(path):
            target = _resolve(module, taken)
            if target and target != name and not name.startswith(target + "."):
                graph[name].add(target)  # a package's module importing its own __init__ is
                # Python's order, not a circle
    return graph


def test_no_folder_holds_more_than_15_modules():
    counts: dict[Path, int] = {}
    for path in ROOT.rglob("*.py"):
        if path.name != "__init__.py":
            counts[path.parent] = counts.get(path.parent, 0) + 1
    crowded = {str(p.relative_to(ROOT.parent)): n for p, n in counts.items() if n > 15}
    assert not crowded, f"folders over 15 modules: {crowded}"


def test_imports_run_one_way():
    graph = _graph()
    seen: dict[str, int] = {}  # 1 on the path, 2 done
    circles = []

    def walk(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(graph[node]):
            if seen.get(nxt) == 1:
                circles.append(path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in seen:
                walk(nxt, path + [nxt])
        seen[node] = 2

    for start in sorted(graph):
        if start not in seen:
            walk(start, [start])
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def _says_why(lines: list[str], line: int) -> bool:
    """Whether the import at `line` (1-based) has a comment on its line or the one above."""
    here, above = lines[line - 1], lines[line - 2] if line > 1 else ""
    return "#" in here or above.strip().startswith("#")


def test_an_import_inside_a_function_says_why():
    silent = []
    for path in MODULES.values():
        lines = path.read_text().splitlines()
        for module, _, inside, line in _imports(path):
            if inside and not _says_why(lines, line):
                silent.append(f"{path.relative_to(ROOT.parent)}:{line}: {module}")
    assert not silent, (
        "zbkit imports inside functions without a reason (a comment on the line or above: "
        "what it keeps fast or optional):\n" + "\n".join(sorted(set(silent)))
    )


def test_no_module_takes_another_folders_private_names():
    taken = []
    for name, path in MODULES.items():
        home = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for module, what, _, line in _imports(path):
            target = _resolve(module, what)
            if target is None:
                continue
            target_path = MODULES[target]
            folder = target if target_path.name == "__init__.py" else target.rpartition(".")[0]
            private_module = any(part.startswith("_") for part in target.split(".")[1:])
            private_name = what is not None and what.startswith("_") and what != "__version__"
            inside = home == folder or home.startswith(folder + ".")  # its own or an ancestor
            if not inside and (private_module or private_name):
                taken.append(f"{path.relative_to(ROOT.parent)}:{line}: {module} {what or ''}")
    assert not taken, "private names read across folders:\n" + "\n".join(taken)
