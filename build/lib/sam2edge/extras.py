"""Optional dependencies: ``require(module)`` imports one, or says in one line which extra installs it.

Extras are declared in pyproject.toml (one per feature) and installed by name by ``scripts/setup.sh``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from sam2edge.errors import UserError

# top-level module -> the extra of pyproject.toml that installs it
EXTRAS: dict[str, str] = {
    "litert_torch": "export",
    "ai_edge_litert": "export",
    "executorch": "export",
    "onnx": "export",
    "onnxruntime": "export",
    "onnxscript": "export",
    "playwright": "browser",
    "av": "video",
    "pycocotools": "everything",
    "ray": "distributed",
    "pyarrow": "distributed",
    "huggingface_hub": "hub",
    "hypothesis": "test",
}
# export target / bundle target -> the modules it imports (all in the "export" extra)
TARGET_MODULES: dict[str, tuple[str, ...]] = {
    "litert": ("litert_torch", "ai_edge_litert"),
    "onnx": ("onnx", "onnxruntime", "onnxscript"),
    "executorch": ("executorch",),
    "executorch-webgpu": ("executorch",),
}
# a bundle's runtime needs only this much of its target's modules
RUNTIME_MODULES: dict[str, tuple[str, ...]] = {
    "litert": ("ai_edge_litert",),
    "onnx": ("onnxruntime",),
    "executorch": ("executorch",),
    "executorch-webgpu": ("executorch",),
}
# what a Python extra cannot install: the fix is another command
NPM_FIX = "run `npm ci` at the repo root (it installs the pinned LiteRT.js from package-lock.json)"


class MissingExtraError(UserError):
    """An optional dependency is not installed; the message names the extra."""


def install_hint(module: str) -> str:
    extra = EXTRAS.get(module.split(".")[0], "everything")
    return f"pip install 'sam2edge[{extra}]'"


def require(module: str, purpose: str = "") -> ModuleType:
    """Import ``module`` (dotted names allowed) or raise MissingExtraError naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = (e.name or module).split(".")[0]
        if missing != module.split(".")[0] and missing not in EXTRAS:
            raise  # a broken install of something else: not ours to explain
        what = f" (needed for {purpose})" if purpose else ""
        raise MissingExtraError(f"{missing} is not installed{what}; {install_hint(missing)}") from None


def have(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    top = module.split(".")[0]
    if top in sys.modules:
        return sys.modules[top] is not None
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def require_all(modules: tuple[str, ...], purpose: str) -> None:
    """``require`` each module that cannot be found, without importing the ones that can (imports are slow)."""
    for m in modules:
        if not have(m):
            require(m, purpose)
