"""The holding layer's place in the house (issue 22): its rules do no I/O, nothing below it
imports it (providers, the contract, ``observe``), and the in-memory providers stand on the
contract alone. Imports are read from the source; ``if TYPE_CHECKING:`` blocks do not count."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sql_lease

PACKAGE = Path(sql_lease.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(path: Path) -> set[str]:
    """The modules ``path`` imports when it runs (at module level or in a function)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in child.names)
            visit(child)

    visit(tree)
    return found


def _ours(imports: set[str]) -> set[str]:
    return {name for name in imports if name == "sql_lease" or name.startswith("sql_lease.")}


def _reaches_holding(imports: set[str]) -> set[str]:
    return {
        name
        for name in imports
        if name.startswith(("sql_lease.holding", "sql_lease.sync_holding")) or name == "sql_lease.decorator"
    }


@pytest.mark.parametrize(
    "module",
    [
        "contract.py",
        "errors.py",
        "observe.py",
        "memory.py",
        "sql/provider.py",
        "sql/sync_provider.py",
        "sql/operations.py",
        "django/providers.py",
    ],
)
def test_no_arrow_from_below_up_into_holding(module: str) -> None:
    """Providers do not inherit from the holding layer, and observe reads no private registry of it."""
    assert not _reaches_holding(runtime_imports(PACKAGE / module)), f"{module} imports the holding layer"


def test_memory_providers_stand_on_the_contract_alone() -> None:
    ours = _ours(runtime_imports(PACKAGE / "memory.py"))
    assert ours <= {"sql_lease", "sql_lease.contract", "sql_lease.errors"} | {
        name for name in ours if name.startswith(("sql_lease.contract.", "sql_lease.errors."))
    }, ours


def test_the_holding_rules_do_no_io() -> None:
    """rules.py decides; only the faces wait (asyncio, threads) and call providers."""
    imports = runtime_imports(PACKAGE / "holding" / "rules.py")
    forbidden = {"asyncio", "threading", "time", "sqlalchemy", "sql_lease.holding.aio", "sql_lease.holding.threads"}
    assert not {name for name in imports if name.split(".")[0] in forbidden or name in forbidden}, imports


def test_the_two_faces_do_not_import_each_other() -> None:
    aio = runtime_imports(PACKAGE / "holding" / "aio.py")
    threads = runtime_imports(PACKAGE / "holding" / "threads.py")
    assert not any(name.startswith("sql_lease.holding.threads") for name in aio)
    assert not any(name.startswith("sql_lease.holding.aio") for name in threads)


def test_the_provider_shortcuts_are_the_holding_functions() -> None:
    from sql_lease import sync_holding
    from sql_lease.holding import aio

    memory, sync_memory = sql_lease.InMemoryLeaseProvider(), sql_lease.SyncInMemoryLeaseProvider()
    assert memory.hold.func is aio.hold and memory.hold.args == (memory,)  # type: ignore[attr-defined]
    assert sync_memory.acquire_lease_wait.func is sync_holding.acquire_lease_wait  # type: ignore[attr-defined]


def test_held_leases_are_counted_through_the_registration() -> None:
    from sql_lease import observe

    before = observe.held_leases()
    with sql_lease.SyncInMemoryLeaseProvider().hold("layers:k"):
        assert observe.held_leases() == before + 1
    assert observe.held_leases() == before
