"""sam2edge: Meta's SAM 2 family on the edge (LiteRT, ExecuTorch, ONNX, the browser), every artifact checked
against the original code.

The Python API is imported lazily (module ``__getattr__``), so ``import sam2edge`` stays fast and needs neither
torch's model code nor any optional extra until a class is used::

    from sam2edge import Sam2Predictor, Sam2VideoPredictor, Sam2AutomaticMaskGenerator
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.2.0"

# public name -> module that defines it (imported on first attribute access)
_LAZY: dict[str, str] = {
    "Sam2Predictor": "sam2edge.runtime.predictor",
    "Sam2VideoPredictor": "sam2edge.runtime.video_predictor",
    "Sam2AutomaticMaskGenerator": "sam2edge.runtime.automatic",
}

__all__ = ["Sam2AutomaticMaskGenerator", "Sam2Predictor", "Sam2VideoPredictor", "__version__"]

if TYPE_CHECKING:  # static checkers and IDEs see the real classes
    from sam2edge.runtime.automatic import Sam2AutomaticMaskGenerator
    from sam2edge.runtime.predictor import Sam2Predictor
    from sam2edge.runtime.video_predictor import Sam2VideoPredictor


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sam2edge' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
