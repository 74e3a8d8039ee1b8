"""``sam2edge verify-official PT SAFETENSORS``: the two official files hold bit-identical weights (SAM 2.1 or
EdgeTAM: the model is detected from the first file's tensors). The image path always; the memory path too when
both files hold it (a video model's files: ``Sam2VideoModel`` / ``EdgeTamVideoModel``), each through its strict
key map."""

from __future__ import annotations

import argparse

import torch

from sam2edge.errors import UserError

OFFICIAL_PT = {"edgetam": "edgetam.pt"}  # model -> the original repository's file name (else SAM 2.1 Hiera-Tiny's)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pt", help="Meta's sam2.1_hiera_tiny.pt or EdgeTAM's edgetam.pt")
    p.add_argument("safetensors", help="Hugging Face model.safetensors")


def run(args: argparse.Namespace) -> int:
    from sam2edge.config import get_config, model_id
    from sam2edge.weights import OFFICIAL_SHA256, checkpoint_config, read_checkpoint, sha256_file, to_sam2edge
    from sam2edge.weights.load import expected_shapes

    config = checkpoint_config(args.pt)
    shapes = expected_shapes(get_config(config))
    pt_name = OFFICIAL_PT.get(model_id(config), "sam2.1_hiera_tiny.pt")
    loaded, raw = {}, {}
    for path, name in ((args.pt, pt_name), (args.safetensors, "model.safetensors")):
        sd, fmt = read_checkpoint(path)
        digest = sha256_file(path)
        known = OFFICIAL_SHA256.get(name) if model_id(config) == "sam2.1-hiera-tiny" else None
        if known is None:
            official = f"{model_id(config)}: no official SHA-256 on record"
        else:
            official = "official" if digest == known else f"NOT the official {name}"
        print(f"{path}: sha256 {digest} ({official}); {len(sd)} tensors, {fmt} naming")
        loaded[fmt] = to_sam2edge(sd, fmt, shapes, str(path))
        raw[fmt] = (sd, str(path))
    if set(loaded) != {"meta", "hf"}:
        raise UserError("give one Meta .pt and one HF .safetensors (both files use the same naming)")
    differ = [k for k in shapes if not torch.equal(loaded["meta"][k], loaded["hf"][k])]
    n = len(shapes)
    video = _memory_path(raw, config)
    if video is not None:
        differ += [k for k in video["meta"] if not torch.equal(video["meta"][k], video["hf"][k])]
        n += len(video["meta"])
    part = "image-path" if video is None else "image- and memory-path"
    if differ:
        print(f"FAIL: {len(differ)}/{n} {part} tensors differ, e.g. {', '.join(differ[:4])}")
        return 1
    note = "" if video is not None else " (video-only tensors are not part of the image path)"
    print(f"OK: {n}/{n} {part} tensors bit-identical{note}")
    return 0


def _memory_path(raw: dict, config: str) -> dict | None:
    """{fmt: memory-path tensors under sam2edge names} when both files hold a video model, else None."""
    from sam2edge.config import get_config, get_video_config
    from sam2edge.weights.video import map_video_tensors

    if not all(any(k.startswith("memory_attention.") for k in sd) for sd, _ in raw.values()):
        return None
    cfg, vcfg = get_config(config), get_video_config(config)
    return {fmt: map_video_tensors(sd, fmt, cfg, vcfg, path) for fmt, (sd, path) in raw.items()}
