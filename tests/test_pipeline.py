"""The one export pipeline and the bundle format, parametrized over the target registry.

Cheap by design: the out-folder guard runs before any converter is imported, and the backends' artifact
check runs before any runtime loads a file, so both are tested for every target on small fake folders.
(The real exports of every target, whose fidelity.json is validated against the one schema, are in
test_litert / test_onnx / test_executorch; the pipeline validates it before writing, too.)
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sam2edge.bundle import finalize_bundle, load_card, validate_fidelity, verify_manifest
from sam2edge.bundle.fidelity import validate_stored
from sam2edge.checks.fidelity.bars import BARS, check_bars
from sam2edge.cli.main import main
from sam2edge.errors import UserError
from sam2edge.targets import TARGETS, resolve

SOURCE = {"checkpoint": "synthetic", "format": "synthetic", "sha256": None}
GOOD_FIDELITY = {
    "reference": "eager fp32",
    "outputs": {"encoder.image_embed": {"cosine": 0.9999999, "max_abs": 1e-5}},
    "end_to_end": {"clicks": 40, "photos": ["a"], "iou_median": 1.0, "iou_worst": 0.999},
    "bars": {"min_cosine": 0.99999},
    "passed": True,
    "failures": [],
}


def _tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` -> its SHA-256 (to prove nothing changed)."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _export(target: str, out: Path, *extra: str) -> int:
    return main(["export", "--target", target, "--config", "test-small", "--out", str(out), *extra])


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    errors = [ln for ln in err if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in "\n".join(err), err
    return errors[0]


# ---- the out-folder guard, every target ----------------------------------------------------------------


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_export_refuses_a_non_bundle_folder_and_a_file(target: str, tmp_path: Path, capsys) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "holiday.jpg").write_bytes(b"\xff\xd8 my photo")
    (folder / "sub").mkdir()
    (folder / "sub" / "notes.txt").write_text("keep me")
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(b"\xff\xd8 another photo")
    before_folder, before_file = _tree(folder), photo.read_bytes()
    assert _export(target, folder) == 2
    assert "is not an export bundle" in _one_line_error(capsys)
    assert _export(target, photo) == 2
    assert "existing file" in _one_line_error(capsys)
    assert _tree(folder) == before_folder and photo.read_bytes() == before_file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["photo.jpg", "photos"]  # no temporary left behind


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_export_refuses_the_current_folder_and_an_input(target: str, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "card.json").write_text("{}")  # even a folder that looks like a bundle
    assert _export(target, Path(".")) == 2
    assert "current folder" in _one_line_error(capsys)
    bundle = tmp_path / "old_bundle"
    bundle.mkdir()
    (bundle / "card.json").write_text("{}")
    ckpt = bundle / "weights.pt"
    ckpt.write_bytes(b"weights")
    before = _tree(tmp_path)
    assert _export(target, bundle, "--checkpoint", str(ckpt)) == 2
    assert "holds the input" in _one_line_error(capsys)
    assert _tree(tmp_path) == before


# ---- backends refuse a tampered artifact, every backend ---------------------------------------------------


def _fake_bundle(folder: Path, target: str) -> Path:
    """A bundle of ``target`` whose artifacts are placeholder bytes under the names its backend opens."""
    names = {
        "litert": ("encoder.tflite", "decoder.tflite", "mask_encoder.tflite"),
        "onnx": ("encoder.onnx", "decoder.onnx"),
        "executorch": ("encoder.pte", "decoder.pte"),
    }[target]
    folder.mkdir()
    for i, name in enumerate(names):
        (folder / name).write_bytes(bytes(range(256)) * (i + 2))
    roles = dict(zip(names, ("encoder", "decoder", "mask-encoder")))
    finalize_bundle(
        folder,
        target=target,
        precision="fp32",
        resolution=256,
        config="test-small",
        source=SOURCE,
        command="test",
        artifacts=roles,
        fidelity=GOOD_FIDELITY,
    )
    return folder


@pytest.mark.parametrize("target", sorted(t for t, e in TARGETS.items() if e.backend))
@pytest.mark.parametrize("how", ["modified", "truncated", "missing"])
def test_every_backend_refuses_a_tampered_artifact(target: str, how: str, tmp_path: Path) -> None:
    pytest.importorskip(TARGETS[target].runtime_package.replace("-", "_"))
    cls = resolve(TARGETS[target].backend)
    b = _fake_bundle(tmp_path / "b", target)
    victim = b / load_card(b)["artifacts"][-1]["file"]
    if how == "modified":
        data = bytearray(victim.read_bytes())
        data[17] ^= 1
        victim.write_bytes(bytes(data))
    elif how == "truncated":
        victim.write_bytes(victim.read_bytes()[:-1])
    else:
        victim.unlink()
    with pytest.raises(UserError) as e:
        cls.from_bundle(b, threads=1)
    msg = str(e.value)
    assert victim.name in msg and "\n" not in msg
    assert ("missing" if how == "missing" else "does not match") in msg


@pytest.mark.parametrize("target", sorted(t for t, e in TARGETS.items() if e.backend))
def test_backends_check_the_card_before_the_runtime(target: str, tmp_path: Path) -> None:
    """Untampered placeholder files pass the artifact check and reach the runtime, which refuses them itself;
    a card naming another target is refused by name."""
    pytest.importorskip(TARGETS[target].runtime_package.replace("-", "_"))
    cls = resolve(TARGETS[target].backend)
    b = _fake_bundle(tmp_path / "b", target)
    with pytest.raises(UserError) as e:
        cls.from_bundle(b)
    assert "does not match" not in str(e.value)
    card = json.loads((b / "card.json").read_text())
    card["target"] = next(t for t in TARGETS if t != target)
    (b / "card.json").write_text(json.dumps(card))
    with pytest.raises(UserError, match="bundle, not"):
        cls.from_bundle(b)


@pytest.mark.parametrize("bad", [["litert"], {"name": "litert"}, 7, ""])
def test_card_with_a_malformed_target_is_one_line(bad, tmp_path: Path, capsys) -> None:
    b = _fake_bundle(tmp_path / "b", "onnx")
    card = json.loads((b / "card.json").read_text())
    card["target"] = bad
    (b / "card.json").write_text(json.dumps(card))
    with pytest.raises(UserError, match="field 'target'"):
        load_card(b)
    out = ["--out", str(tmp_path / "m.png"), "--overlay", str(tmp_path / "o.png")]
    assert main(["segment", "sample:astronaut.png", "--point", "10,10", "--model", str(b), *out]) == 2
    assert "target" in _one_line_error(capsys)


# ---- writers verify the manifest first ----------------------------------------------------------------------


def test_card_render_refuses_a_tampered_bundle(tmp_path: Path, capsys) -> None:
    b = _fake_bundle(tmp_path / "b", "onnx")
    data = bytearray((b / "decoder.onnx").read_bytes())
    data[3] ^= 0xFF
    (b / "decoder.onnx").write_bytes(bytes(data))
    before = _tree(b)
    assert main(["card", "render", str(b)]) == 2
    assert "decoder.onnx" in _one_line_error(capsys)
    assert _tree(b) == before  # manifest.json not laundered, no README written
    assert verify_manifest(b) and any("decoder.onnx" in p for p in verify_manifest(b))


@pytest.mark.parametrize(
    "fidelity",
    [
        '{"outputs": {"x": {"cosine": 1.0}}}',  # partial: the export fields half there
        '{"reference": "r", "outputs": [], "end_to_end": {}, "bars": {}, "passed": true, "failures": []}',
        '{"verify": {"passed": true}}',  # a partial verify entry
        '{"reference": "r",',  # not JSON
        "[1, 2]",
    ],
)
def test_card_render_refuses_a_malformed_fidelity_json(fidelity: str, tmp_path: Path, capsys) -> None:
    b = _fake_bundle(tmp_path / "b", "onnx")
    (b / "fidelity.json").write_text(fidelity)
    before = _tree(b)
    assert main(["card", "render", str(b)]) == 2
    assert "fidelity.json" in _one_line_error(capsys)
    assert _tree(b) == before


def test_card_render_on_an_intact_bundle_keeps_the_manifest_valid(tmp_path: Path, capsys) -> None:
    b = _fake_bundle(tmp_path / "b", "onnx")
    assert main(["card", "render", str(b)]) == 0
    assert (b / "README.md").is_file() and verify_manifest(b) == []


# ---- the one schema and the bars ------------------------------------------------------------------------------


def test_schema_accepts_the_documented_shape_and_names_what_is_wrong() -> None:
    assert validate_fidelity(dict(GOOD_FIDELITY)) and validate_stored({"verify": dict(GOOD_FIDELITY)})
    assert validate_stored({}) == {}  # a bundle measured by nothing yet
    for field in ("reference", "outputs", "end_to_end", "bars", "passed", "failures"):
        doc = {k: v for k, v in GOOD_FIDELITY.items() if k != field}
        with pytest.raises(UserError, match=f"'{field}'"):
            validate_fidelity(doc)
    with pytest.raises(UserError, match="'per_output'|'outputs'"):
        validate_fidelity({**GOOD_FIDELITY, "outputs": None, "per_output": {}})


@pytest.mark.parametrize("precision", sorted(BARS))
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_output_never_passes_a_bar(precision: str, bad: float) -> None:
    good_out = {"decoder.masks": {"cosine": 1.0, "max_abs": 0.0, "nonfinite": 0}}
    e2e = {"clicks": 40, "iou_median": 1.0, "iou_worst": 1.0, "nonfinite": 0}
    assert check_bars(good_out, e2e, BARS[precision]) == []
    assert check_bars({"decoder.masks": {**good_out["decoder.masks"], "nonfinite": 3}}, e2e, BARS[precision])
    assert check_bars({"decoder.masks": {"cosine": bad, "max_abs": bad}}, e2e, BARS[precision])
    assert check_bars(good_out, {**e2e, "nonfinite": 1}, BARS[precision])
    assert check_bars(good_out, {**e2e, "iou_worst": float("nan")}, BARS[precision])


def test_measurement_of_a_nan_backend_fails(tmp_path: Path) -> None:
    """A backend whose decoder returns NaN logits (and NaN scores) fails every precision's bars."""
    from sam2edge.checks.fidelity.measure import measure_backend
    from sam2edge.config import TEST_SMALL
    from sam2edge.runtime.backends import Decoded, EagerBackend
    from sam2edge.weights import synthetic_state_dict

    ref = EagerBackend.from_state_dict(synthetic_state_dict(TEST_SMALL), TEST_SMALL)

    class NanDecoder:
        name, cfg = "nan", ref.cfg

        def encode(self, image):
            return ref.encode(image)

        def decode(self, feats, coords, labels, mask_input):
            d = ref.decode(feats, coords, labels, mask_input)
            return Decoded(
                *(np.full_like(a, np.nan) for a in (d.masks, d.iou, d.single_mask, d.single_iou)), d.object_score
            )

    for precision in ("fp16", "int8"):  # the IoU-only bars: NaN masks are empty masks, NaN must still fail
        report = measure_backend(ref, NanDecoder(), precision, clicks=5)
        assert not report["passed"] and any("non-finite" in f for f in report["failures"]), report["failures"]
        validate_fidelity(report)


def test_registry_drives_the_cli_and_the_backend_lookup(capsys) -> None:
    from sam2edge.runtime.backends import BACKENDS

    assert set(BACKENDS) == {t for t, e in TARGETS.items() if e.backend}
    assert main(["export", "--target", "nope", "--out", "x"]) == 2
    err = _one_line_error(capsys)
    assert all(t in err for t in TARGETS)
    assert main(["export", "--target", "executorch-webgpu", "--precision", "fp16", "--out", "x"]) == 2
    assert "fp32" in _one_line_error(capsys)


def test_bundle_copy_stays_valid(tmp_path: Path) -> None:
    b = _fake_bundle(tmp_path / "b", "onnx")
    shutil.copytree(b, tmp_path / "c")
    assert verify_manifest(tmp_path / "c") == []
