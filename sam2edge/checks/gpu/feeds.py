"""Inputs for the GPU check: what each kind of .tflite file is fed, chosen by its signature.

Kinds (``KINDS``, first match wins; the names are the LiteRT bundle contract of ``export.litert``):
  decoder  inputs image_embeddings [1,C,e,e], feat_s0 [1,C/8,4e,4e], feat_s1 [1,C/4,2e,2e],
           sparse_prompt [1,K,C], sparse_valid [1,K], dense_prompt [1,C,e,e]: one feed per click of
           ``fidelity.click_set`` on real photos; features of the photo, host-encoded prompt tokens.
  decoder-batched  the decoder's inputs with sparse_prompt [B,K,C], B > 1 (``export.batched``): one
           feed of B grid points on a real photo (the automatic mask generator's prompts).
  encoder  one input image [1,3,S,S]: a real photo, resized to S and ImageNet-normalised.
  video    the video graphs of ``export --video`` (an input named like a slot / flag of
           ``runtime.video.bundle.VIDEO_GRAPHS``): seeded standard-normal features, but validity masks,
           flags and slot indices as the host feeds them (0 / 1, integer slot positions, t / t_max in
           [-1, 1]); two runs: half the slots filled (flags 1) and every slot filled (flags 0).
  generic  anything else: one feed of seeded standard-normal float32 per input.

Decoder context (features and prompt tables), from the file's own folder when it is a LiteRT bundle
(``encoder.tflite`` run on the LiteRT CPU runtime, ``*.bin`` host tables), else from the deterministic
synthetic checkpoint of the config whose widths match (``source`` says which).
Clicks are given in original-photo pixels and mapped to model-input pixels (X * S / W, Y * S / H);
the token layout is the predictor's: box corners (labels 2, 3), then points, then one pad (label -1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sam2edge.checks.fidelity import Prompt, click_set, photo
from sam2edge.errors import UserError

DECODER_INPUTS = ("image_embeddings", "feat_s0", "feat_s1", "sparse_prompt", "sparse_valid", "dense_prompt")
FEATURES = ("image_embeddings", "feat_s0", "feat_s1")
ENCODER_PHOTO = "astronaut.png"


@dataclass
class Feeds:
    """Arrays (shared by key) and one dict per run: input name -> array key."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    runs: list[dict[str, str]] = field(default_factory=list)
    prompts: list[Prompt] = field(default_factory=list)  # decoder: the click of each run
    source: str = ""  # where the inputs came from, for the report


def _image(name: str, size: int) -> np.ndarray:
    from sam2edge.runtime.preprocess import preprocess

    return preprocess(photo(name), size).numpy()  # 1x3xSxS float32


def encoder_feeds(inputs: dict[str, list[int]], folder: Path | None, clicks: int) -> Feeds:
    size = inputs["image"][-1]
    return Feeds({"image": _image(ENCODER_PHOTO, size)}, [{"image": "image"}], source=f"photo {ENCODER_PHOTO}")


def generic_feeds(inputs: dict[str, list[int]], folder: Path | None, clicks: int) -> Feeds:
    rng = np.random.default_rng(0)
    arrays = {n: rng.standard_normal(shape).astype(np.float32) for n, shape in inputs.items()}
    return Feeds(arrays, [{n: n for n in inputs}], source="seeded standard normal")


VIDEO_FLAGS = ("mem_valid", "ptr_valid", "sparse_valid", "binarize", "has_mask")


def _video_input(name: str, shape: list[int], run: int, rng) -> np.ndarray:
    """One input of a video graph in run 0 (half the slots filled, flags 1) or run 1 (all filled, flags 0)."""
    n = int(np.prod(shape[1:])) if shape else 1
    rows = lambda x: np.ascontiguousarray(np.broadcast_to(x.reshape(1, *shape[1:]), shape))  # noqa: E731 - per object
    if name in ("mem_valid", "ptr_valid", "sparse_valid"):
        filled = n if run else max(1, n // 2)
        return rows((np.arange(n) < filled).astype(np.float32))
    if name in ("binarize", "has_mask"):
        return np.full(shape, 0.0 if run else 1.0, np.float32)
    if name == "mem_tpos":
        return rows((np.arange(n) % 7).astype(np.float32))
    if name == "ptr_pos":
        return rows(np.linspace(-1, 1, n, dtype=np.float32))
    if name in ("rope_cos", "rope_sin"):  # the memory attention's RoPE tables, as the host feeds them
        from sam2edge.model.memory_attention import rope_tables

        cos, sin = rope_tables(shape[1], int(round(shape[0] ** 0.5)), 1, 10000.0)  # SAM 2.1: 1 head, theta 1e4
        return (cos if name == "rope_cos" else sin).numpy().astype(np.float32)
    scale = 4.0 if name in ("low_res", "mask_input") else 1.0  # mask logits
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def video_feeds(inputs: dict[str, list[int]], folder: Path | None, clicks: int) -> Feeds:
    rng = np.random.default_rng(0)
    feeds = Feeds(source="seeded standard normal; validity masks, flags and slot positions as the host feeds them")
    for run in (0, 1):
        for name, shape in inputs.items():
            feeds.arrays[f"{name}@{run}"] = _video_input(name, shape, run, rng)
        feeds.runs.append({name: f"{name}@{run}" for name in inputs})
    return feeds


# ---- decoder -------------------------------------------------------------------------------------


def _bundle_context(folder: Path, d_model: int, size: int) -> tuple[Callable[[np.ndarray], dict], dict] | None:
    """(photo -> features, host tables) from a LiteRT bundle folder, or None when it is not one."""
    from sam2edge.runtime.backends.litert import ENCODER_FILE, SIGNATURE, TABLE_FILES, read_tables

    if not (folder / ENCODER_FILE).is_file() or not all((folder / f).is_file() for f in TABLE_FILES):
        return None
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(folder / ENCODER_FILE), num_threads=2).get_signature_runner(SIGNATURE)
    return (lambda x: {k: np.asarray(v) for k, v in runner(image=x).items()}), read_tables(folder, d_model)


def _synthetic_context(d_model: int, size: int) -> tuple[Callable[[np.ndarray], dict], dict, str]:
    """(photo -> features, host tables, config name) from the synthetic checkpoint of a matching config."""
    import torch

    from sam2edge.config import CONFIGS
    from sam2edge.model import Rewrites, build_sam2
    from sam2edge.runtime.prompts import prompt_tables
    from sam2edge.weights import load_weights

    name = next((n for n, c in CONFIGS.items() if c.d_model == d_model), None)
    if name is None:
        raise UserError(f"decoder width {d_model} matches no config in sam2edge.config.CONFIGS; check a bundle folder")
    cfg = CONFIGS[name].at_resolution(size)
    sd, _ = load_weights(None, cfg)
    model = build_sam2(cfg, Rewrites())
    model.load_state_dict(sd)
    model.eval()

    @torch.no_grad()
    def encode(x: np.ndarray) -> dict:
        return dict(zip(FEATURES, (t.numpy() for t in model.encode_image(torch.from_numpy(x)))))

    return encode, prompt_tables(model), name


def prompt_tokens(p: Prompt, hw: tuple[int, int], size: int, tables: dict, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """A click (original pixels) -> (sparse_prompt 1xKxC, sparse_valid 1xK) in the predictor's layout."""
    from sam2edge.runtime.prompts import encode_points, prompt_layout

    coords, labels = prompt_layout(p.box, p.point_coords, p.point_labels, np.array([hw[1], hw[0]], np.float32), size)
    return encode_points(coords[0], labels[0], tables, size, slots)


def decoder_feeds(inputs: dict[str, list[int]], folder: Path | None, clicks: int) -> Feeds:
    from sam2edge.runtime.prompts import no_mask_dense

    e, d_model, slots = inputs["image_embeddings"][-1], inputs["image_embeddings"][1], inputs["sparse_prompt"][1]
    size = 16 * e
    ctx = _bundle_context(folder, d_model, size) if folder is not None else None
    if ctx is not None:
        (encode, tables), source = ctx, "the bundle's encoder.tflite on LiteRT CPU, its host tables"
    else:
        encode, tables, name = _synthetic_context(d_model, size)
        source = f"synthetic checkpoint, config {name} at {size}px (no bundle next to the file)"
    feeds = Feeds(source=source)
    feeds.arrays["dense_prompt"] = no_mask_dense(tables, e)
    for i, p in enumerate(click_set(clicks)):
        img = photo(p.photo)
        if f"{p.photo}/image_embeddings" not in feeds.arrays:
            for k, v in encode(_image(p.photo, size)).items():
                feeds.arrays[f"{p.photo}/{k}"] = v
        tok, valid = prompt_tokens(p, img.shape[:2], size, tables, slots)
        feeds.arrays[f"{i}/sparse_prompt"], feeds.arrays[f"{i}/sparse_valid"] = tok, valid
        run = {k: f"{p.photo}/{k}" for k in FEATURES}
        run.update(sparse_prompt=f"{i}/sparse_prompt", sparse_valid=f"{i}/sparse_valid", dense_prompt="dense_prompt")
        feeds.runs.append(run)
        feeds.prompts.append(p)
    return feeds


def batched_decoder_feeds(inputs: dict[str, list[int]], folder: Path | None, clicks: int) -> Feeds:
    """One run: B grid points (one point + upstream's pad per row, the automatic mask generator's prompts)
    on the encoder photo; features and tables as ``decoder_feeds``."""
    from sam2edge.runtime.prompts import encode_points, no_mask_dense

    e, d_model = inputs["image_embeddings"][-1], inputs["image_embeddings"][1]
    batch, slots = inputs["sparse_prompt"][:2]
    size = 16 * e
    ctx = _bundle_context(folder, d_model, size) if folder is not None else None
    encode, tables = ctx if ctx is not None else _synthetic_context(d_model, size)[:2]
    side = int(np.ceil(np.sqrt(batch)))
    grid = (np.stack(np.meshgrid(np.arange(side), np.arange(side)), -1).reshape(-1, 2)[:batch] + 0.5) * size / side
    rows = [encode_points(np.array([xy, [0, 0]]), np.array([1, -1]), tables, size, slots) for xy in grid]
    feeds = Feeds(source="bundle" if ctx is not None else "synthetic checkpoint")
    feeds.arrays.update(encode(_image(ENCODER_PHOTO, size)), dense_prompt=no_mask_dense(tables, e))
    feeds.arrays["sparse_prompt"] = np.concatenate([r[0] for r in rows])  # (B, K, C)
    feeds.arrays["sparse_valid"] = np.concatenate([r[1] for r in rows])  # (B, K)
    feeds.runs.append({k: k for k in DECODER_INPUTS})
    return feeds


def _is_decoder(inputs: dict[str, list[int]]) -> bool:
    return set(DECODER_INPUTS) <= set(inputs)


def _is_batched_decoder(inputs: dict[str, list[int]]) -> bool:
    return _is_decoder(inputs) and inputs["sparse_prompt"][0] > 1


def _is_encoder(inputs: dict[str, list[int]]) -> bool:
    shape = inputs.get("image")
    return len(inputs) == 1 and shape is not None and len(shape) == 4 and shape[1] == 3 and shape[2] == shape[3]


# kind -> (does this signature's inputs {name: shape} match?, feed builder(inputs, folder, clicks))
KINDS: dict[str, tuple[Callable[[dict], bool], Callable[[dict, Path | None, int], Feeds]]] = {
    "decoder-batched": (_is_batched_decoder, batched_decoder_feeds),
    "decoder": (_is_decoder, decoder_feeds),
    "encoder": (_is_encoder, encoder_feeds),
    "video": (lambda inputs: any(f in inputs for f in ("mem_valid", "binarize", "has_mask")), video_feeds),
    "generic": (lambda inputs: True, generic_feeds),
}


def kind_of(inputs: dict[str, list[int]]) -> str:
    return next(k for k, (match, _) in KINDS.items() if match(inputs))


def build_feeds(inputs: dict[str, list[int]], folder: Path | None, clicks: int) -> tuple[str, Feeds]:
    kind = kind_of(inputs)
    return kind, KINDS[kind][1](inputs, folder, clicks)
