"""The package's shape, as issue 24 set it: the core knows no environment family, its modules
import each other without cycles, and no module reaches into another's private names.

Imports are read from the source (every ``import``, inside functions too; those under
``if TYPE_CHECKING:`` do not run and are left out), so a late import cannot hide a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "dreamgym_agents"
PACKAGE = "dreamgym_agents"
ADAPTERS = f"{PACKAGE}.adapters"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def core_modules() -> dict[str, Path]:
    return {module_name(p): p for p in CORE.rglob("*.py")
            if "bundles" not in p.relative_to(CORE).parts}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    return skipped


def imports(path: Path, module: str) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, imported names) of every runtime import in a file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_nodes(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[: len(parent) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            found.append((node.lineno, base, [alias.name for alias in node.names]))
    return found


def test_the_core_never_imports_a_family_adapter():
    offenders = [f"{path.relative_to(ROOT)}:{line} imports {target}"
                 for module, path in core_modules().items()
                 for line, target, names in imports(path, module)
                 if target == ADAPTERS or target.startswith(ADAPTERS + ".")
                 or (target == PACKAGE and "adapters" in names)]
    assert not offenders, "\n".join(offenders)


def _graph() -> dict[str, set[str]]:
    modules = core_modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for _, target, names in imports(path, module):
            candidates = [target, *(f"{target}.{n}" for n in names)]
            for name in candidates:
                if name in modules and name != module:
                    graph[module].add(name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (a module → the modules it imports), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_core_has_no_import_cycle():
    graph = _graph()
    # a package's __init__ re-exporting its own modules is not a cycle through them
    for module in graph:
        graph[module] = {m for m in graph[module] if not module.startswith(m + ".")}
    cycle = find_cycle(graph)
    assert cycle is None, " → ".join(cycle or [])


def test_no_private_name_crosses_a_module():
    modules = core_modules()
    offenders = []
    for module, path in modules.items():
        for line, target, names in imports(path, module):
            if not target.startswith(PACKAGE) or target == module:
                continue
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private:
                offenders.append(f"{path.relative_to(ROOT)}:{line} {target}: {private}")
    assert not offenders, "\n".join(offenders)


def test_below_the_cli_and_the_pipeline_a_family_is_handed_down_not_looked_up():
    """Issue 51: a run resolves its family once and hands it down; below ``cli/`` and
    ``pipeline/`` a family is built by name (``make_family``, ``family_part``) only in the
    registry itself and in the buffer, for a buffer opened without its family (it embeds by
    the family its saved config names) and for a task of another family in a shared buffer."""
    allowed = {("dreamgym_agents.episodes.env", "make_family"),  # family_part builds by it
               ("dreamgym_agents.buffer.embedding", "family_part"),
               ("dreamgym_agents.buffer.replay", "family_part")}
    found = set()
    for module, path in core_modules().items():
        if module.split(".")[1:2] in (["cli"], ["pipeline"]):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in ("make_family", "family_part"):
                    found.add((module, name))
    assert found == allowed
