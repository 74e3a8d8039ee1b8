"""ONNX fp16: the encoder's weights stored in fp16 and computed in fp32.

Every float initializer of >= ``FP16_MIN_ELEMENTS`` values becomes fp16 behind a Cast to fp32, after the offline
optimisation so that constant folding cannot undo it: the error is weight rounding only, as with LiteRT's fp16
recipe on a CPU. fp16 arithmetic (``model.half()``; onnxruntime's CPU provider has no fp16 GEMM speed-up on CPUs
without fp16 arithmetic) missed the fp16 median bar for ordinary random checkpoints (``export.kept``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

FP16_MIN_ELEMENTS = 256  # smaller float constants (scales, eps, biases of tiny layers) stay fp32


def fp16_storage(src: Path, dst: Path, min_elements: int = FP16_MIN_ELEMENTS) -> dict:
    """``src`` with every float32 initializer of >= ``min_elements`` values stored as fp16 and cast back to
    fp32 by a ``Cast`` node at the top of the graph: fp16 on disk, fp32 arithmetic on weights rounded to fp16
    (onnxruntime folds the casts once when it opens the file). Returns the census for card.json."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    m = onnx.load(str(src))
    casts, kept, stored = [], 0, 0
    for i, init in enumerate(m.graph.initializer):
        if init.data_type != TensorProto.FLOAT or int(np.prod(init.dims)) < min_elements:
            kept += int(init.data_type == TensorProto.FLOAT)
            continue
        half = numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), f"{init.name}__fp16")
        casts.append(helper.make_node("Cast", [half.name], [init.name], to=TensorProto.FLOAT, name=f"{half.name}_cast"))
        m.graph.initializer[i].CopyFrom(half)
        stored += 1
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(casts + nodes)
    onnx.save(m, str(dst), save_as_external_data=False)
    return {"method": "fp16 initializers + Cast to fp32 (fp16 storage, fp32 compute)", "fp16": stored, "fp32": kept}
