"""sam2edge: the SAM 2 family (SAM 2.1 tiny / small / base-plus / large, EdgeTAM) on the edge, with proof.

The three predictors are importable from the top level and load lazily, so ``import sam2edge`` stays fast and
needs no optional extra::

    from sam2edge import Sam2Predictor, Sam2VideoPredictor, Sam2AutomaticMaskGenerator
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

# Import-time notices of the toolchains that are not about the user's work: torchao's optional CUDA kernels that this
# CPU build cannot load, and torch's pytree deprecation notice for an enum torchao registers. Left on, they come
# before every one-line error of an ExecuTorch command. Errors from these loggers still show.
for _name in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_name).setLevel(logging.ERROR)

__version__ = "0.3.0"

# public name -> module that defines it (imported on first access)
_LAZY: dict[str, str] = {
    "Sam2Predictor": "sam2edge.runtime.predictor",
    "Sam2VideoPredictor": "sam2edge.runtime.video.predictor",
    "Sam2AutomaticMaskGenerator": "sam2edge.runtime.automatic.generator",
}

__all__ = ["Sam2AutomaticMaskGenerator", "Sam2Predictor", "Sam2VideoPredictor", "__version__"]

if TYPE_CHECKING:  # for type checkers and IDEs; never executed
    from sam2edge.runtime.automatic.generator import Sam2AutomaticMaskGenerator
    from sam2edge.runtime.predictor import Sam2Predictor
    from sam2edge.runtime.video.predictor import Sam2VideoPredictor


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sam2edge' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
