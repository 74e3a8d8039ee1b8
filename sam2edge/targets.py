"""The export-target registry: one entry per runtime a bundle can be made for (a leaf module, like timm's
``_registry``: it names code by dotted path and imports nothing of sam2edge, so every layer may read it).

A new target is one converter module under ``sam2edge/export/`` (``TargetSpec`` there), one backend under
``sam2edge/runtime/`` (``from_bundle(folder, *, threads=None)``) and one line in ``TARGETS``. ``cli/export``,
the backend lookup (``runtime.backends.backend_for``), the model card and ``bench`` read only this table.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from sam2edge.errors import UserError


@dataclass(frozen=True)
class Target:
    name: str  # registry key, also card.json "target" and `--target`
    converter: str  # "module:attr" of the target's export spec (sam2edge.export.pipeline.TargetSpec)
    backend: str | None  # "module:attr" of the runtime class with from_bundle(folder, *, threads=None); None: not here
    precisions: tuple[str, ...]  # --precision values it offers
    title: str  # human name of the runtime, for cards and tables
    library: str  # Hugging Face library_name of the model card
    runtime_package: str  # the pip package that runs the bundle
    extra: str = "export"  # the sam2edge extra that installs what the converter needs
    int8_layers: tuple[str, ...] = ("linear",)  # encoder layer kinds its int8 recipe quantises ("linear", "conv")


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "litert",
            "sam2edge.export.litert:SPEC",
            "sam2edge.runtime.backends.litert:LiteRTBackend",
            ("fp32", "fp16", "int8"),
            "LiteRT (.tflite)",
            "litert",
            "ai-edge-litert",
            int8_layers=("linear", "conv"),  # dynamic-range int8 of fully connected and convolution weights
        ),
        Target(
            "onnx",
            "sam2edge.export.onnx:SPEC",
            "sam2edge.runtime.backends.onnx:OnnxBackend",
            ("fp32", "fp16", "int8"),
            "ONNX (onnxruntime)",
            "onnx",
            "onnxruntime",
        ),
        Target(
            "executorch",
            "sam2edge.export.executorch:SPEC",
            "sam2edge.runtime.backends.executorch:ExecuTorchBackend",
            ("fp32", "fp16", "int8"),
            "ExecuTorch (.pte, XNNPACK)",
            "executorch",
            "executorch",
        ),
        Target(
            "executorch-webgpu",
            "sam2edge.export.executorch_webgpu:SPEC",
            None,  # the browser runs it (card 004); export verifies its XNNPACK twin on CPU
            ("fp32",),
            "ExecuTorch WebGPU (.pte)",
            "executorch",
            "executorch",
        ),
    )
}


def get_target(name: object) -> Target:
    """The registry entry of ``name``; an unknown name (or not a string) is a one-line UserError."""
    if not isinstance(name, str) or name not in TARGETS:
        raise UserError(f"unknown target {name!r}; choose one of {', '.join(sorted(TARGETS))}")
    return TARGETS[name]


def resolve(spec: str) -> object:
    """Import ``"module:attr"`` and return the attribute (targets are imported only when used); a missing
    optional dependency is one line naming the extra to install."""
    module, attr = spec.split(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("sam2edge"):
            raise
        raise UserError(
            f"{module} needs the package {e.name!r}; install it with `pip install sam2edge[export]`"
        ) from None
