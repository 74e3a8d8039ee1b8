"""Bad EdgeTAM checkpoints on ``segment``, ``track`` and ``export``: one line naming the tensor (or, for a file that
is neither SAM 2.1 nor EdgeTAM, what it holds), exit 2, no traceback, nothing written. Both layouts: the original
repository's ``edgetam.pt`` (sam2edge video names are its names) and transformers' ``EdgeTamVideoModel``
``model.safetensors`` (written here through the inverse of the strict key map). Reduced config, synthetic weights:
no oracle is needed to refuse a file.
"""

from __future__ import annotations

import pytest
import torch

from sam2edge.config import get_config, get_video_config

CONFIG = "test-small-edgetam"


def _hf(sd: dict) -> dict:
    """sam2edge video tensors -> transformers' EdgeTamVideoModel names (image path: ``from_sam2edge``; memory path:
    ``video_hf_name``, a ``KV`` name split into k and v)."""
    from sam2edge.weights.load import from_sam2edge
    from sam2edge.weights.video import KV, MEMORY_PATH, video_hf_name

    vcfg = get_video_config(CONFIG)
    final = 3 * (vcfg.mask_stride.bit_length() - 1)
    out = from_sam2edge({k: v for k, v in sd.items() if not k.startswith(MEMORY_PATH)}, "hf")
    for k, v in sd.items():
        if k.startswith(MEMORY_PATH):
            name = video_hf_name(k, final, edgetam=True)
            if KV in name:
                half = v.shape[0] // 2
                out[name.replace(KV, "k")], out[name.replace(KV, "v")] = v[:half], v[half:]
            else:
                out[name] = v
    return out


# id -> (layout, damage, tensor named in the message); damage: "drop" or "shape"
CASES = {
    "official-missing-repvit": (
        "meta",
        "drop",
        "image_encoder.trunk.body.stages_1.blocks.0.channel_mixer.conv1.bn.weight",
    ),
    "official-misshaped-perceiver": ("meta", "shape", "spatial_perceiver.layers.0.attn.to_kv.weight"),
    "official-missing-memory-attention": ("meta", "drop", "memory_attention.layers.1.cross_attn_image.k_proj.bias"),
    "hf-missing-perceiver-v": ("hf", "drop", "spatial_perceiver.layers.1.self_attention.v_proj.weight"),
    "hf-misshaped-decoder": ("hf", "shape", "mask_decoder.iou_token.weight"),
    "hf-missing-neck": ("hf", "drop", "vision_encoder.neck.convs.1.bias"),
}
MEMORY_ONLY = ("perceiver", "memory-attention")  # damage the image commands never read


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    from safetensors.torch import save_file

    from sam2edge.weights.video import synthetic_video_state_dict

    sd = synthetic_video_state_dict(get_config(CONFIG), get_video_config(CONFIG), seed=2)
    folder = tmp_path_factory.mktemp("bad-edgetam")
    out = {}
    for case, (layout, damage, name) in CASES.items():
        t = dict(sd) if layout == "meta" else _hf(sd)
        assert name in t, name
        if damage == "drop":
            del t[name]
        else:
            t[name] = torch.zeros(t[name].shape[0] + 1, *t[name].shape[1:])
        if layout == "meta":
            path = folder / f"{case}.pt"
            torch.save({"model": t}, path)
        else:
            path = folder / f"{case}.safetensors"
            save_file({k: v.contiguous() for k, v in t.items()}, str(path))
        out[case] = path
    other = folder / "other.pt"  # neither SAM 2.1 nor EdgeTAM: a ResNet-like stem and head
    torch.save({"model": {"conv1.weight": torch.zeros(8, 3, 7, 7), "fc.weight": torch.zeros(10, 8)}}, other)
    out["neither"] = other
    return out


def _argv(command: str, ckpt, tmp_path, clip) -> tuple[list[str], object]:
    out = tmp_path / {"segment": "mask.png", "track": "masks", "export": "bundle"}[command]
    ck = ["--checkpoint", str(ckpt), "--out", str(out)]
    if command == "segment":
        return ["segment", "sample:astronaut.png", "--point", "100,100", "--overlay", str(tmp_path / "o.png"), *ck], out
    if command == "track":
        return ["track", str(clip), "--point", "0:30,20", *ck], out
    return ["export", "--target", "onnx", "--video", *ck], out


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    from tests.video_oracles import drifting_clip

    folder = tmp_path_factory.mktemp("clip") / "clip"
    drifting_clip(folder, 2, (64, 48))
    return folder


@pytest.mark.parametrize("command", ["segment", "track", "export"])
@pytest.mark.parametrize("case", [*CASES, "neither"])
def test_bad_edgetam_checkpoint_is_one_line(files, clip, case, command, tmp_path, capsys):
    from sam2edge.cli.main import main

    argv, out = _argv(command, files[case], tmp_path, clip)
    if command == "segment" and any(m in case for m in MEMORY_ONLY):
        assert main(argv) == 0 and out.is_file()  # the image path is intact: segment does not read the rest
        return
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in "\n".join(err), err
    assert not out.exists() and not (tmp_path / "o.png").exists(), f"{out} written"
    if case == "neither":
        assert "no SAM 2.1 or EdgeTAM image encoder" in errors[0] and str(files[case]) in errors[0], errors[0]
    else:
        assert CASES[case][2] in errors[0] and "EdgeTAM" in errors[0], errors[0]


@pytest.mark.parametrize("target", ["onnx", "executorch"])
def test_int8_that_would_quantise_nothing_is_refused(target, tmp_path, capsys):
    """ONNX's and ExecuTorch's int8 quantise linear layers; EdgeTAM's RepViT encoder is convolutional, so such a
    bundle would be fp32 under an int8 name: one line naming the alternatives, exit 2, nothing written."""
    from sam2edge.cli.main import main
    from sam2edge.weights.video import synthetic_video_state_dict

    ckpt, out = tmp_path / "edgetam.pt", tmp_path / "bundle"
    torch.save({"model": synthetic_video_state_dict(get_config(CONFIG), get_video_config(CONFIG), seed=2)}, ckpt)
    rc = main(["export", "--target", target, "--precision", "int8", "--checkpoint", str(ckpt), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in "\n".join(err), err
    assert "convolutional" in errors[0] and "--target litert --precision int8" in errors[0], errors[0]
    assert not out.exists()
