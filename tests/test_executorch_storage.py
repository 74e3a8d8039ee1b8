"""ExecuTorch fp16 storage with fp32 arithmetic (``export.executorch_storage``), the fp16 recipe an ExecuTorch
export falls back to where fp16 arithmetic cannot meet the fp16 bars (``export.mixed.fp16_keep``).

The lowered encoder (test-small, two seeds) stores exactly its Linear weights fp16 (its file shrinks by 2 bytes
per such weight element and no more), runs them in fp32 (its outputs match eager fp32 on the same fp16-rounded
weights far below fp16's resolution, and differ from the unrounded fp32 program), and leaves ExecuTorch's
serializer as it was. ``widened`` hands an fp16-arithmetic selection that can keep nothing more to the
storage recipe. The exports through that fallback: ``tests/test_executorch_storage_export.py``.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch")

from sam2edge.checks.fidelity.checkpoints import variant_state_dict  # noqa: E402
from sam2edge.config import TEST_SMALL  # noqa: E402


def _encoder(seed: str):
    from sam2edge.export.executorch import REWRITES
    from sam2edge.export.executorch_graphs import XnnEncoderGraph
    from sam2edge.model import build_sam2

    model = build_sam2(TEST_SMALL, REWRITES)
    model.load_state_dict(variant_state_dict(seed, TEST_SMALL))
    return model.eval(), XnnEncoderGraph


def _run(prog, args):
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(prog.buffer).load_method("forward")
    return method.execute(list(args))


@pytest.mark.parametrize("seed", ["synthetic:1", "synthetic:2"])
def test_encoder_stores_its_linear_weights_fp16_and_computes_in_fp32(seed):
    import executorch.backends.xnnpack.operators.node_visitor as nv

    from sam2edge.export.executorch import lower_program
    from sam2edge.export.executorch_graphs import encoder_inputs
    from sam2edge.export.executorch_storage import linear_weights
    from sam2edge.export.precision import fp16_linear_weights

    get_param_tensor, get_serialized_dtype = nv.get_param_tensor, nv.NodeVisitor.get_serialized_dtype
    model, Graph = _encoder(seed)
    graph, args = Graph(model), encoder_inputs(TEST_SMALL)
    names = linear_weights(graph)
    lifted = dict(graph.named_parameters()) | dict(graph.named_buffers())
    assert names and names <= set(lifted), sorted(names - set(lifted))[:3]
    assert any(n.endswith("attn.qkv.q_weight") for n in names)  # the split q / k / v blocks the graph multiplies by
    # what the encoder program multiplies by: not the decoder's Linears, nor the fused qkv weight (split graph)
    used = {n for n in names if n.startswith("model.image_encoder.") and not n.endswith("qkv.weight")}
    elems = sum(lifted[n].numel() for n in used)

    fp32, _ = lower_program(graph, args, "fp32", "encoder")
    half, _ = lower_program(graph, args, "fp16", "encoder", stored_fp16=names)
    saved = len(fp32.buffer) - len(half.buffer)
    assert 2 * elems <= saved <= 2 * elems + 4096, (saved, 2 * elems)  # every Linear weight fp16, nothing else

    with torch.no_grad():
        want = Graph(fp16_linear_weights(model))(*args)
        exact = Graph(model)(*args)
    got = _run(half, args)
    for g, w, e in zip(got, want, exact, strict=True):
        scale = float(w.abs().max())
        assert float((g - w).abs().max()) <= 1e-5 * scale, (float((g - w).abs().max()), scale)  # fp32 arithmetic
        assert float((w - e).abs().max()) > 1e-6 * scale  # and the weights were rounded
    # the serializer is restored
    assert nv.get_param_tensor is get_param_tensor and nv.NodeVisitor.get_serialized_dtype is get_serialized_dtype


def test_kept_parts_keep_their_linear_weights_fp32():
    from sam2edge.export.executorch_storage import linear_weights

    model, Graph = _encoder("synthetic:1")
    graph = Graph(model)
    every, kept = linear_weights(graph), linear_weights(graph, ("image_encoder.trunk.blocks.1",))
    gone = every - kept
    assert gone and all(".image_encoder.trunk.blocks.1." in "." + n for n in gone), sorted(gone)
    assert not any(".blocks.1." in n for n in kept)
    assert any(".blocks.10." in n or ".blocks.2." in n for n in kept)  # "blocks.1" matches whole names only


def test_widened_gives_way_to_fp16_storage_when_nothing_more_can_be_kept():
    """An fp16-arithmetic selection that may fall back (``storage_fallback``) and can keep nothing more after
    its bundle missed becomes a pending storage selection carrying the missed measurement; one without the
    fallback gives up as before."""
    from sam2edge.export.mixed import widened

    sel = {"kept_fp32": [], "holds": True, "ranking": [], "iou_worst": 0.999, "iou_median": 0.9999}
    assert widened(sel, 0.9, 0.99) is None
    more = widened({**sel, "storage_fallback": True}, 0.9, 0.99)
    assert more["pending"] and more["kept_fp32"] == [], more
    assert more["fp16_arithmetic"]["bundle_checks"] == [{"kept": 0, "iou_worst": 0.9, "iou_median": 0.99}]
    assert more["fp16_arithmetic"]["holds"] and more["fp16_arithmetic"]["kept_fp32"] == []
