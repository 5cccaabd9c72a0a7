"""Host programs (narwhal_assets/host/) stay runnable on the hosts' Python 3.8 while the type check reads them:
their syntax is 3.8's, and where no `from __future__ import annotations` defers them, every annotation Python
evaluates (a signature, a module- or class-level variable) is a string or a plain name, never `list[str]` or
`str | None`, which 3.8 cannot evaluate."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HOST = Path(__file__).resolve().parents[2] / "narwhal_assets" / "host"
PROGRAMS = sorted(HOST.rglob("*.py"))


def _defers_annotations(tree: ast.Module) -> bool:
    imports = [node for node in tree.body if isinstance(node, ast.ImportFrom) and node.module == "__future__"]
    return any(alias.name == "annotations" for node in imports for alias in node.names)


def _evaluated_annotations(tree: ast.Module) -> list[ast.expr]:
    """The annotations Python evaluates at definition time: signatures anywhere, variables outside functions."""
    found: list[ast.expr] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
            found.extend(a.annotation for a in every if a is not None and a.annotation is not None)
            if node.returns is not None:
                found.append(node.returns)
        elif isinstance(node, ast.AnnAssign) and not in_function:
            found.append(node.annotation)
        inside = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, False)
    return found


def _python38_evaluates(annotation: ast.expr) -> bool:
    return isinstance(annotation, ast.Constant | ast.Name | ast.Attribute)


@pytest.mark.parametrize("program", PROGRAMS, ids=[str(p.relative_to(HOST)) for p in PROGRAMS])
def test_a_host_program_runs_on_python38(program: Path) -> None:
    source = program.read_text(encoding="ascii")
    tree = ast.parse(source, feature_version=(3, 8))
    if _defers_annotations(tree):
        return
    wrong = [f"{program.name}:{a.lineno}: {ast.unparse(a)}" for a in _evaluated_annotations(tree)
             if not _python38_evaluates(a)]  # fmt: skip
    assert not wrong, "quote these annotations (Python 3.8 evaluates them):\n" + "\n".join(wrong)


def test_the_check_sees_what_python38_would_refuse() -> None:
    tree = ast.parse('def f(a: list[str], b: "list[str]") -> int | None:\n    c: dict[str, int] = {}\nX: set[int]\n')
    assert [ast.unparse(a) for a in _evaluated_annotations(tree) if not _python38_evaluates(a)] == [
        "list[str]", "int | None", "set[int]"
    ]  # fmt: skip
    assert not _defers_annotations(tree)
