"""The SAM 2.1 image path, re-authored for export: one file per stage."""

from sam2edge.model.layers import UPSTREAM, Rewrites
from sam2edge.model.sam2 import Sam2ImageModel, build_sam2

__all__ = ["Rewrites", "UPSTREAM", "Sam2ImageModel", "build_sam2"]
