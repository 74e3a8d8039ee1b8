"""Which model (SAM 2.1 size or EdgeTAM) a checkpoint holds, read from its tensor shapes (Meta or HF naming).

EdgeTAM's RepViT trunk is told by its timm names (``stem.conv1.c.weight``): its widths and blocks per stage are
read from the token mixers' shapes (``stages_{i}.blocks.{j}.token_mixer.conv.c.weight``).

Shapes fix a trunk's stage-1 width (``pos_embed`` channels), its pos-embed background grid and
first window side, its block count and stage boundaries (the first block of a stage carries a
shortcut ``proj``), and the FPN width. Heads, global blocks and later window sides leave no trace
in shapes; they follow from the one registered config whose shape signature matches
(``tests/test_sizes.py`` holds the registry to unique signatures).

``detect_config`` is pure (state dict -> config name); ``checkpoint_config`` reads only shapes of
a file (memory-mapped .pt, lazily opened .safetensors); ``check_size`` turns a checkpoint of one
size loaded with another size's config into one line naming both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import torch

from sam2edge.config import CONFIGS, Sam2Config
from sam2edge.errors import UserError, first_sentence

# format -> (trunk prefix, FPN lateral conv of the lowest-resolution level, whose out-channels = d_model)
_LAYOUT = {
    "meta": ("image_encoder.trunk.", "image_encoder.neck.convs.0.conv.weight"),
    "hf": ("vision_encoder.backbone.", "vision_encoder.neck.convs.0.weight"),
}
# format -> RepViT trunk prefix (EdgeTAM: timm's repvit_m1 names, ``stages_{i}.blocks.{j}.``) and FPN conv, as above
_REPVIT_LAYOUT = {
    "meta": ("image_encoder.trunk.body.", "image_encoder.neck.convs.0.conv.weight"),
    "hf": ("vision_encoder.backbone.timm_model.", "vision_encoder.neck.convs.0.weight"),
}
DEFAULT_CONFIG = "sam2.1-hiera-tiny"  # the synthetic checkpoint's size when none is named


class SizeError(UserError):
    """A checkpoint whose size matches no config, or not the config asked for."""


def config_signature(cfg: Sam2Config) -> tuple:
    """(stage-1 width, stages, pos-embed background, first window side, FPN width) of a Hiera config;
    ("repvit", widths, blocks per stage, FPN width) of a RepViT (EdgeTAM) config."""
    if cfg.trunk == "repvit":
        return ("repvit", tuple(cfg.repvit_dims), tuple(cfg.repvit_depths), cfg.d_model)
    return (cfg.embed_dim, tuple(cfg.stages), tuple(cfg.window_pos_embed_bkg), cfg.window_spec[0], cfg.d_model)


def _repvit_signature(shapes: Mapping[str, tuple[int, ...]]) -> tuple | None:
    """("repvit", widths, blocks per stage, FPN width) read from timm-named RepViT tensors; None if none."""
    for body, neck in _REPVIT_LAYOUT.values():
        if body + "stem.conv1.c.weight" not in shapes or neck not in shapes:
            continue
        block = re.compile(re.escape(body) + r"stages_(\d+)\.blocks\.(\d+)\.token_mixer\.conv\.c\.weight$")
        blocks: dict[int, list[int]] = {}
        for k, shape in shapes.items():
            if m := block.match(k):
                blocks.setdefault(int(m.group(1)), []).append(int(shape[0]))
        n = max(blocks, default=-1) + 1
        if sorted(blocks) != list(range(n)) or n == 0:
            return ("repvit", (), (), int(shapes[neck][0]))
        dims = tuple(blocks[i][0] for i in range(n))
        return ("repvit", dims, tuple(len(blocks[i]) for i in range(n)), int(shapes[neck][0]))
    return None


def shape_signature(shapes: Mapping[str, tuple[int, ...]]) -> tuple | None:
    """The same signature read from a checkpoint's {name: shape} (Meta or HF names); None if no trunk."""
    if (sig := _repvit_signature(shapes)) is not None:
        return sig
    for trunk, neck in _LAYOUT.values():
        pe, pew = shapes.get(trunk + "pos_embed"), shapes.get(trunk + "pos_embed_window")
        if pe is None or pew is None or neck not in shapes:
            continue
        block = re.compile(re.escape(trunk) + r"blocks\.(\d+)\.")
        ids = {int(m.group(1)) for k in shapes if (m := block.match(k))}
        starts = sorted(i for i in ids if trunk + f"blocks.{i}.proj.weight" in shapes)  # first block of stages 2..n
        bounds = [0, *starts, max(ids, default=-1) + 1]
        stages = tuple(b - a for a, b in zip(bounds[:-1], bounds[1:]))
        return (int(pe[1]), stages, (int(pe[2]), int(pe[3])), int(pew[2]), int(shapes[neck][0]))
    return None


def _describe(sig: tuple | None) -> str:
    if sig is None:
        return "no SAM 2.1 or EdgeTAM image encoder"
    if sig[0] == "repvit":
        return f"RepViT widths {list(sig[1])}, blocks {list(sig[2])}, FPN width {sig[3]}"
    return f"Hiera width {sig[0]}, stages {list(sig[1])}, FPN width {sig[4]}"


def detect_config(sd: Mapping[str, torch.Tensor | tuple[int, ...]], source: str = "checkpoint") -> str:
    """Name of the registered config (``sam2edge.config.CONFIGS``) whose shapes the state dict has.

    Full-size configs win over test configs of the same signature (there are none today).
    Raises SizeError naming what the checkpoint holds when nothing matches.
    """
    sig = shape_signature({k: tuple(v.shape) if hasattr(v, "shape") else tuple(v) for k, v in sd.items()})
    matches = [name for name, cfg in CONFIGS.items() if sig is not None and config_signature(cfg) == sig]
    if not matches and sig is not None and sig[0] == "repvit":
        # a damaged RepViT (a token mixer missing or mis-shaped): the one EdgeTAM config of that FPN width, so that
        # the strict key map names the tensor instead of a shape summary
        matches = [n for n, c in CONFIGS.items() if c.trunk == "repvit" and c.d_model == sig[3]][:1]
    if not matches:
        known = ", ".join(n for n in CONFIGS if not n.startswith("test-"))
        raise SizeError(
            f"{source} holds {_describe(sig)}, which is none of the known models ({known});"
            " pass an unmodified SAM 2.1 or EdgeTAM checkpoint"
        )
    return sorted(matches, key=lambda n: n.startswith("test-"))[0]


def unreadable_checkpoint(path: str | Path, e: BaseException) -> str:
    """The one-line message for a checkpoint file its reader (torch.load / safetensors) failed on with ``e``."""
    return (
        f"cannot read checkpoint {path}: {first_sentence(e)}; the file is truncated or not a PyTorch/safetensors"
        " checkpoint (re-download it)"
    )


def checkpoint_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """{name: shape} of a .pt / .safetensors file without reading its data where the format allows."""
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 - not a dict
        try:
            obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # legacy (non-zip) .pt files cannot be memory-mapped
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any reader failure is a bad file to the user
        raise SizeError(unreadable_checkpoint(path, e)) from None
    sd = obj["model"] if isinstance(obj, dict) and "model" in obj else obj
    if not isinstance(sd, dict):
        raise SizeError(f"checkpoint {path} holds no tensor state dict; pass a SAM 2.1 .pt or model.safetensors")
    return {k: tuple(v.shape) for k, v in sd.items() if isinstance(v, torch.Tensor)}


def checkpoint_config(spec: str | None) -> str:
    """Config name for a checkpoint spec (path, hub id, or None / synthetic / the default official weights ->
    Hiera-Tiny)."""
    from sam2edge.weights.load import DEFAULT_CHECKPOINT, SYNTHETIC, resolve_checkpoint

    path = resolve_checkpoint(spec)
    if path in (SYNTHETIC, DEFAULT_CHECKPOINT):
        return DEFAULT_CONFIG
    return detect_config(checkpoint_shapes(path), f"checkpoint {path}")


def check_size(sd: Mapping[str, torch.Tensor], cfg: Sam2Config, source: str) -> None:
    """One-line SizeError when ``sd`` is a recognised size other than ``cfg``'s; silent otherwise.

    A checkpoint that matches no size is left to the strict key map, which lists what is wrong.
    """
    sig = shape_signature({k: tuple(v.shape) for k, v in sd.items()})
    if sig is None or sig == config_signature(cfg) or sig not in {config_signature(c) for c in CONFIGS.values()}:
        return
    try:
        held = detect_config(sd, source)
    except SizeError:
        return
    asked = next((n for n, c in CONFIGS.items() if config_signature(c) == config_signature(cfg)), "the given config")
    raise SizeError(
        f"{source} holds {held} weights but the config is {asked}; "
        f"drop --config to detect the size from the weights, or pass --config {held}"
    )
