"""LiteRT mixed precision (``export.litert_mixed``): the measured selection's parts stay fp32 in the .tflite.

The ops that land in the graph are read back from the flatbuffer: with parts kept, their FULLY_CONNECTED /
CONV_2D weights are float32 and every other weighted op's are int8 (dynamic-range recipe) or float16 (fp16
recipe); with nothing kept the recipe is litert-torch's own. The end-to-end export (test-small, an outlier
checkpoint whose all-int8 LiteRT encoder misses the int8 goal) ships with the kept layers and passes its own
fidelity check; with nothing allowed fp32 it is refused, naming the layers and ``diagnose``.
"""

from __future__ import annotations

import pytest
import torch

from sam2edge.checks.fidelity.checkpoints import variant_state_dict
from sam2edge.config import TEST_SMALL

QKV = "image_encoder.trunk.blocks.1.attn.qkv"
CONV = "sam_mask_decoder.conv_s0"
BLOCK = "image_encoder.trunk.blocks.2"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The test-small encoder graph converted fp32 by litert-torch, with its module and the model's name in it."""
    from sam2edge.export.litert import ENCODER_FILE, convert_graph, graphs
    from sam2edge.export.litert_mixed import Owners, model_prefix
    from sam2edge.model import Rewrites, build_sam2

    model = build_sam2(TEST_SMALL, Rewrites())
    model.load_state_dict(variant_state_dict("synthetic:1", TEST_SMALL))
    module, sample = graphs(model.eval(), 8)[ENCODER_FILE]
    path = tmp_path_factory.mktemp("litert_mixed") / "encoder.tflite"
    convert_graph(module, sample, path, "fp32")
    return path.read_bytes(), Owners(module, model_prefix(module, model)), model


def test_every_weighted_op_is_owned_by_a_module_of_the_model(converted):
    from sam2edge.export.litert_mixed import weighted_ops

    fp32, owners, model = converted
    ops = weighted_ops(fp32, owners)
    names = dict(model.named_modules())
    assert ops and all(r["owner"] in names and r["dtype"] == "FLOAT32" for r in ops), ops[:3]
    linears = {n for n, m in names.items() if n.startswith("image_encoder.") and isinstance(m, torch.nn.Linear)}
    assert linears <= {r["owner"] for r in ops}  # every encoder Linear is found by name
    assert sum(r["owner"] == QKV for r in ops) == 1 and sum(r["owner"] == CONV for r in ops) == 1


CASES = [("int8", "INT8", (QKV, CONV)), ("fp16", "FLOAT16", (BLOCK,))]


@pytest.mark.parametrize(("precision", "reduced", "keep"), CASES)
def test_kept_parts_keep_float32_weights_and_the_rest_is_reduced(converted, precision, reduced, keep):
    from sam2edge.export.litert_mixed import in_parts, quantize, weighted_ops

    fp32, owners, _ = converted
    data, census = quantize(fp32, precision, owners, keep)
    ops = weighted_ops(data, owners)
    kept = {r["dtype"] for r in ops if in_parts(r["owner"], keep)}
    rest = {r["dtype"] for r in ops if not in_parts(r["owner"], keep)}
    assert kept == {"FLOAT32"} and rest == {reduced}, (kept, rest)
    n_kept = sum(in_parts(r["owner"], keep) for r in weighted_ops(fp32, owners))
    assert census["fp32_kept_ops"] == n_kept >= len(keep) and not census["leaked"], census
    plain, census0 = quantize(fp32, precision, owners, ())
    assert {r["dtype"] for r in weighted_ops(plain, owners)} == {reduced} and "fp32_kept_ops" not in census0
    assert len(data) > len(plain)  # the kept weights take 4 bytes each


def test_a_kept_part_the_graph_does_not_have_is_an_error(converted):
    from sam2edge.export.litert_mixed import quantize

    fp32, owners, _ = converted
    with pytest.raises(RuntimeError, match="own no weighted op"):
        quantize(fp32, "int8", owners, ("image_encoder.trunk.blocks.99",))
