"""The house's import graph: every arrow points down a layer or stays in its own, and no module
imports itself through others (docs/architecture.md draws the layers).

Every ``import`` in a module counts, also one inside a function: a lazy import that points up is
still an arrow up. Imports under ``if TYPE_CHECKING:`` never run and are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sql_lease

PACKAGE = Path(sql_lease.__file__).parent

# Bottom to top. A module belongs to the first layer with a prefix of its name.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("contract", ("sql_lease.contract", "sql_lease.errors", "sql_lease.observe")),
    (
        "core",
        (
            "sql_lease.sql.dialects",
            "sql_lease.sql.statements",
            "sql_lease.sql.plans",
            "sql_lease.sql.hints",
            "sql_lease.sql.transactional",
            "sql_lease.sql.operations",
            "sql_lease.sql.schema",
            "sql_lease.sql.urls",
            "sql_lease.sql.options",
            "sql_lease.sql.translate",
            "sql_lease.sql.setup",
            "sql_lease.sql.retry",
            "sql_lease.sql.rows",
            "sql_lease.sql.waiters",
            "sql_lease.sql.forks",
            "sql_lease.sql.deadlines",
            "sql_lease.sql.__init__",
            "sql_lease.holding.rules",
        ),
    ),
    (
        "executors",
        (
            "sql_lease.sql.executors",
            "sql_lease.sql.sync_executors",
            "sql_lease.sql.psycopg_async",
            "sql_lease.sql.notify",
            "sql_lease.sql.sync_notify",
            "sql_lease.sql.migrate",
            "sql_lease.sql.fencing",
        ),
    ),
    ("providers", ("sql_lease.memory", "sql_lease.sql.provider", "sql_lease.sql.sync_provider")),
    ("holding", ("sql_lease.holding", "sql_lease.sync_holding")),
    (
        "faces",
        (
            "sql_lease.cli",
            "sql_lease.decorator",
            "sql_lease.django",
            "sql_lease.metrics",
            "sql_lease.__init__",
            "sql_lease.__main__",
        ),
    ),
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _layer(module: str) -> int:
    for index, (_name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                return index
    raise AssertionError(f"{module} is in no layer of tests/test_import_graph.py: place it")


def _resolve(module: str, node: ast.ImportFrom) -> list[str]:
    if node.level:
        base = module.split(".")[:-1]  # a package's __init__ or a module: both drop their last part
        base = base[: len(base) - (node.level - 1)]
        target = ".".join([*base, node.module] if node.module else base)
    else:
        target = node.module or ""
    if not target.startswith("sql_lease"):
        return []
    known = _modules()
    names = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        names.append(sub if sub in known or f"{sub}.__init__" in known else target)
    return names


def _canonical(name: str, known: dict[str, Path]) -> str:
    if name in known:
        return name
    if f"{name}.__init__" in known:
        return f"{name}.__init__"
    raise AssertionError(f"import of {name}, which is not a module of sql_lease")


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    nodes: list[ast.AST] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        nodes.append(node)
        if _is_type_checking(node):
            assert isinstance(node, ast.If)
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))
    return nodes


def _graph() -> dict[str, set[str]]:
    known = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        edges: set[str] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges |= {_canonical(a.name, known) for a in node.names if a.name.startswith("sql_lease")}
            elif isinstance(node, ast.ImportFrom):
                edges |= {_canonical(name, known) for name in _resolve(module, node)}
        edges.discard(module)
        graph[module] = edges
    return graph


def test_every_module_has_a_layer() -> None:
    for module in _modules():
        _layer(module)


def test_no_arrow_points_up() -> None:
    upward = [
        f"{module} ({LAYERS[_layer(module)][0]}) imports {target} ({LAYERS[_layer(target)][0]})"
        for module, targets in sorted(_graph().items())
        for target in sorted(targets)
        if _layer(target) > _layer(module) and not target.endswith("__init__")
    ]
    assert upward == []


def test_no_import_cycle() -> None:
    graph = {m: {t for t in ts if not t.endswith("__init__")} for m, ts in _graph().items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycles.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == []
