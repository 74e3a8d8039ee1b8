"""The precision robustness set: 5 random SAM 2.1 Hiera-Tiny checkpoints nothing here was tuned on.

Every checkpoint is upstream's own model (``sam2.build_sam.build_sam2('configs/sam2.1/sam2.1_hiera_t.yaml',
ckpt_path=None)``, Meta's initialisation, seeded), written in Meta's format (``{"model": state_dict}``, .pt) or,
for one of them, as HF-named ``model.safetensors``-style tensors, so every reader of the project loads them:

  upstream-s0           seed 0, upstream's initialisation as is (its zero-initialised tensors stay zero)
  upstream-s1-perturbed seed 1, every floating tensor + 0.02 * randn (what a fine-tune moves)
  upstream-s2-perturbed seed 2, the same perturbation; written as HF-named .safetensors
  upstream-s3           seed 3, as is
  upstream-s4-outliers  seed 4, perturbed, plus outlier channels as trained transformers have them: in every
                        Hiera stage, OUTLIER_CHANNELS fixed residual channels carry a large offset (the patch
                        embedding's bias, x OUTLIER_OFFSET) and every block's LayerNorms amplify them
                        (weight x OUTLIER_GAIN), so the activations entering qkv / fc1 have a few channels
                        ~10x larger than the rest (the case SmoothQuant-style scaling is for)

Deterministic: the same folder content (and ``manifest.json`` SHA-256s) on every run.

    .venv/bin/python scripts/robustness_set.py --out /tmp/robustness_set
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

UPSTREAM_CONFIG = "configs/sam2.1/sam2.1_hiera_t.yaml"
PERTURB = 0.02  # std of the additive perturbation (as the project's synthetic weights)
OUTLIER_CHANNELS = 4  # outlier residual channels per Hiera stage
OUTLIER_GAIN = 10.0  # LayerNorm weight factor on those channels
OUTLIER_OFFSET = 8.0  # patch-embedding bias added on the first stage's outlier channels (x stream std ~ 1)


def _perturb(sd: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 + seed)
    return {k: v + PERTURB * torch.randn(v.shape, generator=g) if v.is_floating_point() else v for k, v in sd.items()}


def _outliers(sd: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """A few residual channels per stage with large values, amplified by every block's LayerNorms."""
    sd = {k: v.clone() for k, v in sd.items()}
    g = torch.Generator().manual_seed(20_000 + seed)
    chans: dict[int, torch.Tensor] = {}  # width -> outlier channel indices (one set per stage width)
    for k, v in sd.items():
        if k.startswith("image_encoder.trunk.blocks.") and ".norm" in k and k.endswith(".weight"):
            width = v.shape[0]
            if width not in chans:
                chans[width] = torch.randperm(width, generator=g)[:OUTLIER_CHANNELS]
            v[chans[width]] *= OUTLIER_GAIN
    bias = sd["image_encoder.trunk.patch_embed.proj.bias"]
    bias[chans[bias.shape[0]]] += OUTLIER_OFFSET
    return sd


@dataclass(frozen=True)
class Member:
    name: str  # file stem
    seed: int  # torch.manual_seed before upstream's build (its initialisation)
    transform: Callable[[dict, int], dict] | None  # applied to upstream's state dict
    fmt: str  # "meta" (.pt) or "hf" (.safetensors)
    what: str  # one line for the manifest


def _perturb_outliers(sd: dict, seed: int) -> dict:
    return _outliers(_perturb(sd, seed), seed)


MEMBERS: tuple[Member, ...] = (
    Member("upstream-s0", 0, None, "meta", "upstream init, seed 0"),
    Member("upstream-s1-perturbed", 1, _perturb, "meta", "upstream init, seed 1, + 0.02 randn"),
    Member("upstream-s2-perturbed", 2, _perturb, "hf", "upstream init, seed 2, + 0.02 randn (HF names)"),
    Member("upstream-s3", 3, None, "meta", "upstream init, seed 3"),
    Member("upstream-s4-outliers", 4, _perturb_outliers, "meta", "seed 4, + 0.02 randn, outlier channels"),
)


def upstream_state_dict(seed: int) -> dict[str, torch.Tensor]:
    """Upstream SAM2Base (Hiera-Tiny) state dict after its own seeded initialisation."""
    from sam2.build_sam import build_sam2

    torch.manual_seed(seed)
    model = build_sam2(UPSTREAM_CONFIG, ckpt_path=None, device="cpu", mode="eval")
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def member_state_dict(member: Member) -> dict[str, torch.Tensor]:
    sd = upstream_state_dict(member.seed)
    return member.transform(sd, member.seed) if member.transform is not None else sd


def _write(member: Member, sd: dict[str, torch.Tensor], folder: Path) -> Path:
    if member.fmt == "hf":
        from safetensors.torch import save_file

        from sam2edge.config import HIERA_TINY
        from sam2edge.weights.load import expected_shapes, from_sam2edge

        image = {k: sd[k] for k in expected_shapes(HIERA_TINY)}  # the image path, sam2edge (= Meta) names
        path = folder / f"{member.name}.safetensors"
        save_file({k: v.contiguous() for k, v in from_sam2edge(image, "hf").items()}, str(path))
    else:
        path = folder / f"{member.name}.pt"
        torch.save({"model": sd}, str(path))
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_set(folder: Path, names: list[str] | None = None) -> dict[str, Path]:
    """Write the set's checkpoints (or those named) into ``folder``; name -> path. A file already there with
    the manifest's SHA-256 is kept (the set is deterministic)."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path = folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    out = {}
    for m in MEMBERS:
        if names and m.name not in names:
            continue
        known = manifest.get(m.name, {})
        path = folder / known.get("file", "-")
        if known and path.is_file() and _sha256(path) == known["sha256"]:
            out[m.name] = path
            continue
        path = _write(m, member_state_dict(m), folder)
        manifest[m.name] = {"file": path.name, "sha256": _sha256(path), "what": m.what, "format": m.fmt}
        out[m.name] = path
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for the checkpoints and manifest.json")
    p.add_argument("--only", nargs="*", help="member names to write (default all)")
    args = p.parse_args(argv)
    bad = sorted(set(args.only or []) - {m.name for m in MEMBERS})
    if bad:
        print(f"error: unknown member(s) {bad}; choose from {[m.name for m in MEMBERS]}", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"error: --out {out} is a file; give a folder", file=sys.stderr)
        return 2
    for name, path in write_set(out, args.only).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
