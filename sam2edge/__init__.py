"""sam2edge: SAM 2.1 Hiera-Tiny for the edge, with proof."""

__version__ = "0.1.0"

from sam2edge.runtime.predictor import Sam2Predictor  # noqa: E402

__all__ = ["Sam2Predictor", "__version__"]
