"""The code's shape: the import layering (import-linter contract), size limits, and the target registry."""

from __future__ import annotations

import ast
import inspect
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sam2edge.targets import TARGETS, resolve

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60
# import-linter's own command, run by this interpreter through its API: no `lint-imports` script needs to sit
# beside the interpreter (a venv's bin, a system install), and a missing import-linter fails, never skips
LINT_IMPORTS = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; c()"]


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    return subprocess.run([*LINT_IMPORTS, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_layers_contract_is_kept() -> None:
    r = _lint_imports(ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "KEPT" in r.stdout


@pytest.mark.parametrize(
    "module, upward",
    [
        ("runtime/backends/onnx.py", "sam2edge.export.pipeline"),  # runtime -> export (an old cycle)
        ("bundle/card.py", "sam2edge.runtime.backends"),  # bundle -> runtime
        ("model/layers.py", "sam2edge.cli.main"),  # model -> cli
    ],
)
def test_lint_fails_on_an_upward_lazy_import(tmp_path: Path, module: str, upward: str) -> None:
    """A copy of the package with one lazy (function-level) upward import: the contract must break."""
    shutil.copytree(ROOT / "sam2edge", tmp_path / "sam2edge", ignore=shutil.ignore_patterns("__pycache__", "static"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / "sam2edge" / module
    path.write_text(path.read_text() + f"\n\ndef _cycle():\n    import {upward}  # noqa\n")
    r = _lint_imports(tmp_path)
    assert r.returncode != 0 and "BROKEN" in r.stdout, r.stdout[-2000:]
    assert "sam2edge." + module[:-3].replace("/", ".") in r.stdout  # the offending module is named


def _function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    doc = (
        body[0].end_lineno - body[0].lineno + 1
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0].value, "value", None), str)
        else 0
    )
    return node.end_lineno - node.lineno + 1 - doc


def test_size_limits() -> None:
    """No module over 400 lines, no function over 60 (docstring excluded), anywhere in sam2edge/."""
    too_long = []
    for path in sorted((ROOT / "sam2edge").rglob("*.py")):
        src = path.read_text()
        rel = path.relative_to(ROOT)
        if len(src.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{rel}: {len(src.splitlines())} lines")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _function_lines(node) > MAX_FUNCTION_LINES:
                too_long.append(f"{rel}:{node.lineno} {node.name}() {_function_lines(node)} lines")
    assert not too_long, "\n".join(too_long)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_registry_entry_resolves(name: str) -> None:
    """Every registered target names a converter spec and (where it runs here) a backend with the one protocol."""
    target = TARGETS[name]
    pytest.importorskip(target.runtime_package.replace("-", "_").replace("ai_edge_litert", "ai_edge_litert"))
    spec = resolve(target.converter)
    assert spec.name == name
    if target.backend is not None:
        params = inspect.signature(resolve(target.backend).from_bundle).parameters
        assert params["threads"].kind is inspect.Parameter.KEYWORD_ONLY and params["threads"].default is None
