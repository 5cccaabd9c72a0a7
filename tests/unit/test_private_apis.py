"""Private APIs of the libraries we depend on are used in one adapter module each, which says why."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "narwhal_assets"
# module -> the library whose private API it adapts (its docstring explains why there is no public way)
ADAPTERS = {"runtime/instance_storage.py": "dagster", "ssh/pipelined.py": "paramiko"}
# Standard-library names that are underscored but documented: the exit without cleanup a forked child needs,
# and the type `add_subparsers` returns (typeshed's spelling; argparse exports no public alias).
STANDARD = {"os._exit", "argparse._SubParsersAction"}


def _private_uses(tree: ast.AST) -> list[str]:
    uses: list[str] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and any(p.startswith("_") and not p.startswith("__") for p in node.module.split("."))
        ):
            uses.append(f"from {node.module} import")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in {"self", "cls"}:
                continue
            if ast.unparse(node) not in STANDARD:
                uses.append(ast.unparse(node))
    return uses


def test_private_library_apis_appear_only_in_their_adapter_module() -> None:
    found = {
        str(path.relative_to(PACKAGE)): _private_uses(ast.parse(path.read_text()))
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    outside = {module: uses for module, uses in found.items() if uses and module not in ADAPTERS}
    assert not outside
    for module in ADAPTERS:
        assert found[module], f"{module} no longer needs a private API: drop it from ADAPTERS"
        assert "private" in (ast.get_docstring(ast.parse((PACKAGE / module).read_text())) or ""), module


def test_the_checker_sees_a_private_import_and_a_private_attribute() -> None:
    sample = "from dagster._core.events import DagsterEvent\nimport paramiko\nparamiko.SSHConfig()._config\n"
    assert _private_uses(ast.parse(sample)) == ["from dagster._core.events import", "paramiko.SSHConfig()._config"]
