"""Where the GPU check cuts a graph into pieces (``checks.tflite.slice.best_cut``), on the real delegate.

The memory attention hands its memory, positions and key bias to every layer, so no cut past its first layer is
clean (some output is read once inside the piece and again later). A cut right after a LayerNorm whose closing
ADD feeds one FULLY_CONNECTED inside the piece gets that tensor back wrong from LiteRT's GPU delegate (the ADD is
merged into its reader); the full-size check cut there and reported a false mismatch (cosine 0.9934,
docs/design/gpu.md). If a LiteRT release stops merging it, the assertion on that piece fails and
the rule can go.
"""

from __future__ import annotations

from sam2edge.checks.fidelity.metrics import compare
from sam2edge.checks.gpu import check as gpu_check
from sam2edge.checks.gpu.feeds import Feeds, build_feeds
from sam2edge.checks.tflite import slice as ts


def _piece_cosines(model, feeds: Feeds, end: int, tmp_path) -> dict[str, float]:
    """GPU-vs-CPU cosine of every output of piece [0, end), fed the graph's own inputs (last feed run)."""
    p = ts.piece(model, 0, end)
    path = tmp_path / f"nodes_0_{end}.tflite"
    path.write_bytes(p.data)
    ins, _ = ts.signature_tensors(model)
    given = {t: feeds.arrays[feeds.runs[-1][name]] for name, t in ins.items()}  # graph input tensor -> value
    plan = gpu_check.piece_feeds(p.inputs, [given])
    gpu, cpu = (gpu_check.run_on(path, side, plan)[0] for side in ("gpu", "cpu"))
    return {k: compare(gpu[f"0/{k}"], cpu[f"0/{k}"])["cosine"] for k in p.outputs}


def test_cuts_avoid_a_constant_add_merged_into_its_projection(video_bundle_dir, tmp_path):
    path = video_bundle_dir("litert") / "memory_attention.tflite"
    model = ts.load_model(path)
    n = len(model.subgraphs[0].operators)
    writer, readers = ts._readers(model)
    outs, risk = {int(t) for t in model.subgraphs[0].outputs}, ts._merge_risk(model)
    risky = [c for c in range(1, n) if ts._risky_outputs(writer, readers, outs, 0, c, risk)[1]]
    assert risky, "no LayerNorm feeds one projection: the graph changed"
    # past the first layer's key projection (operator 112 at test-small) every cut hands the memory on
    assert not [c for c in range(113, n // 2) if ts._risky_outputs(writer, readers, outs, 0, c, risk)[0] == 0]
    _, feeds = build_feeds(gpu_check._signature_inputs(path), path.parent, 20)
    bad = _piece_cosines(model, feeds, risky[0], tmp_path)
    assert any(not c >= 0.5 for c in bad.values()), bad  # the ADD merged away: garbage (NaN some runs)
    for target in risky:
        cut = ts.best_cut(model, 0, target, n)
        assert cut != target and ts._risky_outputs(writer, readers, outs, 0, cut, risk)[1] == 0, (target, cut)
    good = _piece_cosines(model, feeds, ts.best_cut(model, 0, risky[0], n), tmp_path)
    assert min(good.values()) >= 0.9999, good
