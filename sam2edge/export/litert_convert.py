"""litert-torch conversion of one graph, whole-precision or with measured parts kept fp32."""

from __future__ import annotations

import gc
from pathlib import Path

import torch
from torch import nn


def convert_graph(module: nn.Module, sample_kwargs: dict[str, torch.Tensor], path: Path, precision: str) -> None:
    """litert-torch conversion of one graph to ``path`` (fp16: fp16 weights, fp32 I/O; int8: dynamic-range
    int8, i.e. int8 per-channel weights, activations quantised per call by XNNPACK, fp32 I/O)."""
    import litert_torch
    from litert_torch.generative.quantize import quant_recipes

    quant = {"fp16": quant_recipes.full_fp16_recipe, "int8": quant_recipes.full_dynamic_recipe}.get(precision)
    quant = quant() if quant is not None else None
    edge = litert_torch.convert(module.eval(), sample_kwargs=sample_kwargs, quant_config=quant)
    edge.export(str(path))
    del edge
    gc.collect()


def convert_kept(
    module: nn.Module, sample_kwargs: dict[str, torch.Tensor], path: Path, precision: str, keep, model: nn.Module
) -> dict:
    """A graph at fp16 / int8: converted fp32, then quantised by litert-torch's recipe with the parts ``keep``
    names left fp32 (``export.litert_mixed``; ``export.mixed``'s measured choice, as ONNX's and ExecuTorch's).
    Returns the weight dtypes read back from the file (card.json ``extra.quantization``)."""
    from sam2edge.export.litert_mixed import Owners, model_prefix, quantize

    convert_graph(module, sample_kwargs, path, "fp32")
    owners = Owners(module, model_prefix(module, model))
    data, census = quantize(path.read_bytes(), precision, owners, keep)
    path.write_bytes(data)
    return census
