"""What the browser needs from a bundle, and where the pinned front-end runtime lies.

Browser encoder of a LiteRT bundle: the artifact with role "encoder" (``BrowserEncoder``; the page runs it on
each photo and clip frame unless it falls back to the server's).

Browser decoder assets of a LiteRT bundle (card.json ``target`` "litert"):
  decoder   the artifact with role "decoder" (a .tflite; TokenDecoderGraph contract)
            inputs  image_embeddings 1xCxexe, feat_s0 1x(C/8)x4ex4e, feat_s1 1x(C/4)x2ex2e,
                    sparse_prompt 1xKxC, sparse_valid 1xK, dense_prompt 1xCxexe
            outputs masks 1x3x4ex4e, iou_scores 1x3, single_mask 1x1x4ex4e, single_iou 1x1, object_score 1x1
  tables    the host prompt tables as raw little-endian float32 .bin files (``runtime.prompts``):
            gaussian (2, C/2), point_embed (4, C), not_a_point (C,), no_mask (C,)
The I/O names in tensor order come from card.json ``extra.io[<decoder file>]`` (by "position"), else
``DECODER_INPUTS`` / ``DECODER_OUTPUTS``; the page maps by tensor name when the model's names are these,
else by position.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

DECODER_INPUTS = ("image_embeddings", "feat_s0", "feat_s1", "sparse_prompt", "sparse_valid", "dense_prompt")
DECODER_OUTPUTS = ("masks", "iou_scores", "single_mask", "single_iou", "object_score")
# names other writers may use -> the canonical names above
ALIASES = {"image_embed": "image_embeddings", "dense": "dense_prompt", "iou": "iou_scores", "pred_masks": "masks"}
TABLES = ("gaussian", "point_embed", "not_a_point", "no_mask")
LITERTJS_PACKAGES = ("@litertjs/core", "@litertjs/wasm-utils")
STATIC_DIR = Path(__file__).parent / "static"


@dataclass
class BrowserDecoder:
    """A decoder the page can run with LiteRT.js: files in ``folder`` and the I/O order."""

    folder: Path
    decoder: str
    tables: dict[str, str]  # table name -> file name in folder
    inputs: tuple[str, ...] = DECODER_INPUTS
    outputs: tuple[str, ...] = DECODER_OUTPUTS
    files: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.files = {self.decoder, *self.tables.values()}

    def describe(self, url_prefix: str) -> dict:
        return {
            "url": url_prefix + self.decoder,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "tables": {k: url_prefix + v for k, v in self.tables.items()},
        }


def _read_card(bundle: Path) -> dict:
    """card.json of ``bundle``, or {} when it is missing or unreadable (the callers then name what is missing)."""
    try:
        return json.loads((bundle / "card.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def browser_decoder(bundle: Path) -> tuple[BrowserDecoder | None, str]:
    """(decoder assets, "") for a bundle the browser can run, else (None, reason in one line)."""
    bundle = Path(bundle)
    card = _read_card(bundle)
    arts = {a.get("file"): a.get("role", "") for a in card.get("artifacts", []) if isinstance(a, dict)}
    decoders = [f for f, r in arts.items() if r == "decoder" and str(f).endswith(".tflite")]
    if not decoders and (bundle / "decoder.tflite").is_file():
        decoders = ["decoder.tflite"]
    if not decoders:
        return None, f"the bundle {bundle.name} has no LiteRT decoder (.tflite)"
    tables = {}
    for name in TABLES:
        hits = [f for f in arts if Path(str(f)).stem == name and str(f).endswith(".bin")] or (
            [f"{name}.bin"] if (bundle / f"{name}.bin").is_file() else []
        )
        if not hits:
            return None, f"the bundle {bundle.name} lacks the prompt table {name}.bin"
        tables[name] = hits[0]
    inputs, outputs = _io_order(card.get("extra") or {}, decoders[0], DECODER_INPUTS, DECODER_OUTPUTS)
    if sorted(inputs) != sorted(DECODER_INPUTS) or sorted(outputs) != sorted(DECODER_OUTPUTS):
        return None, f"the decoder I/O in {bundle.name}/card.json is not the TokenDecoderGraph contract"
    return BrowserDecoder(bundle, decoders[0], tables, inputs, outputs), ""


ENCODER_INPUTS = ("image",)
ENCODER_OUTPUTS = ("image_embeddings", "feat_s0", "feat_s1")


@dataclass
class BrowserEncoder:
    """The bundle's image encoder for the page (LiteRT.js): image 1x3xSxS (preprocessed) -> image_embeddings
    1xCxexe, feat_s0 1x(C/8)x4ex4e, feat_s1 1x(C/4)x2ex2e; I/O names in tensor order."""

    folder: Path
    encoder: str
    inputs: tuple[str, ...] = ENCODER_INPUTS
    outputs: tuple[str, ...] = ENCODER_OUTPUTS
    files: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.files = {self.encoder}

    def describe(self, url_prefix: str) -> dict:
        return {"url": url_prefix + self.encoder, "inputs": list(self.inputs), "outputs": list(self.outputs)}


def browser_encoder(bundle: Path) -> tuple[BrowserEncoder | None, str]:
    """(encoder assets, "") for a LiteRT bundle whose encoder the page can run, else (None, reason in one line)."""
    bundle = Path(bundle)
    card = _read_card(bundle)
    arts = {a.get("file"): a.get("role", "") for a in card.get("artifacts", []) if isinstance(a, dict)}
    encoders = [f for f, r in arts.items() if r == "encoder" and str(f).endswith(".tflite")]
    if not encoders or not (bundle / encoders[0]).is_file():
        return None, f"the bundle {bundle.name} has no LiteRT encoder (.tflite)"
    inputs, outputs = _io_order(card.get("extra") or {}, encoders[0], ENCODER_INPUTS, ENCODER_OUTPUTS)
    if sorted(inputs) != sorted(ENCODER_INPUTS) or sorted(outputs) != sorted(ENCODER_OUTPUTS):
        return None, f"the encoder I/O in {bundle.name}/card.json is not image -> {', '.join(ENCODER_OUTPUTS)}"
    return BrowserEncoder(bundle, encoders[0], inputs, outputs), ""


def _io_order(
    extra: dict, graph: str, inputs: tuple[str, ...], outputs: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A graph's I/O names in the model's tensor order (LiteRT.js lists inputs so; ai-edge-litert's signature
    runner sorts them by name): card ``extra.io[file]`` entries sorted by their "position" (the LiteRT
    exporter writes them), else ``extra.decoder``, else ``inputs`` / ``outputs`` (the argument order)."""
    legacy = extra.get("decoder") if inputs == DECODER_INPUTS else None  # bundles older than extra.io
    io = (extra.get("io") or {}).get(graph) or legacy or {}

    def names(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        items = list(io.get(key) or default)
        if items and all(isinstance(i, dict) and "position" in i for i in items):
            items = sorted(items, key=lambda i: i["position"])  # tensor order, as LiteRT.js lists them
        return tuple(ALIASES.get(n, n) for n in (i["name"] if isinstance(i, dict) else i for i in items))

    return names("inputs", inputs), names("outputs", outputs)


@dataclass
class BrowserTracker:
    """The video graphs and tables the page tracks with (a LiteRT bundle exported with ``--video``).

    The graphs' inputs are the bundle's own (``runtime.video.bundle.graph_io`` of its video config): SAM 2.1's
    memory slots are M x e x e spatial maps and its memory encoder takes the object score; EdgeTAM's slots are
    N = L + G*G perceiver tokens of M channels, its memory attention takes no pointer positions but the key RoPE
    tables, its memory encoder takes the perceiver's latents (``tables["latents"]``) instead of the score."""

    folder: Path
    graphs: dict[str, dict]  # role -> {"file", "inputs", "outputs"} (I/O names in tensor order)
    tables: dict[str, str]  # "const" -> video_const.bin, "rope" -> rope_tables.bin [, "latents" -> ...]
    video: dict  # card.json extra.video (config, num_tokens, slot layout)
    memory_tokens: int | None = None  # tokens of one memory slot after the perceiver (N); None: e*e spatial
    files: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.files = {g["file"] for g in self.graphs.values()} | set(self.tables.values())

    def describe(self, url_prefix: str) -> dict:
        return {
            "graphs": {r: {**g, "url": url_prefix + g["file"]} for r, g in self.graphs.items()},
            "tables": {k: url_prefix + v for k, v in self.tables.items()},
            "config": self.video.get("config", {}),
            "num_tokens": self.video.get("num_tokens"),
            # rope_tables.bin: cos | sin of the frame grid [e*e, C], then (key_rows > 0) cos_k | sin_k [N, C]
            "memory_tokens": self.memory_tokens,
            "rope_key_rows": self.memory_tokens if "rope_cos_k" in self.graphs["memory-attention"]["inputs"] else 0,
        }


def browser_tracker(bundle: Path) -> tuple[BrowserTracker | None, str]:
    """(tracking assets, "") for a LiteRT bundle with video graphs, else (None, reason in one line)."""
    from sam2edge.config import Sam2VideoConfig
    from sam2edge.runtime.video.bundle import CONST_FILE, LATENTS_FILE, ROPE_FILE, VIDEO_GRAPHS, graph_io

    bundle = Path(bundle)
    card = _read_card(bundle)
    extra = card.get("extra") or {}
    if card.get("target") != "litert" or not isinstance(extra.get("video"), dict):
        return None, f"the bundle {bundle.name} has no LiteRT video graphs (export it with --target litert --video)"
    try:
        vcfg = Sam2VideoConfig(**extra["video"].get("config", {}))
    except TypeError as e:
        return None, f"the video config in {bundle.name}/card.json is not this version's ({e}); re-export with --video"
    graphs = {}
    for role in VIDEO_GRAPHS:
        stem, ins, outs = graph_io(role, vcfg)
        file = stem + ".tflite"
        inputs, outputs = _io_order(extra, file, ins, outs)
        if not (bundle / file).is_file() or sorted(inputs) != sorted(ins) or sorted(outputs) != sorted(outs):
            return None, f"the bundle {bundle.name} lacks {file} with its card I/O; re-export it with --video"
        graphs[role] = {"file": file, "inputs": list(inputs), "outputs": list(outputs)}
    tables = {"const": CONST_FILE, "rope": ROPE_FILE}
    if "latents" in graphs["memory-encoder"]["inputs"]:
        tables["latents"] = LATENTS_FILE
    missing = [f for f in tables.values() if not (bundle / f).is_file()]
    if missing:
        return None, f"the bundle {bundle.name} lacks {missing[0]}; re-export it with --video"
    return BrowserTracker(bundle, graphs, tables, extra["video"], vcfg.memory_tokens), ""


def node_modules() -> Path | None:
    """The folder holding the npm-installed LiteRT.js (``npm ci`` at the repo root), or None."""
    env = os.environ.get("SAM2EDGE_NODE_MODULES")
    candidates = [Path(env)] if env else []
    candidates += [p / "node_modules" for p in Path(__file__).resolve().parents]
    candidates.append(Path.cwd() / "node_modules")
    for c in candidates:
        if all((c / pkg / "package.json").is_file() for pkg in LITERTJS_PACKAGES):
            return c
    return None


def litertjs_version(nm: Path | None = None) -> str | None:
    nm = nm or node_modules()
    if nm is None:
        return None
    return json.loads((nm / "@litertjs/core/package.json").read_text()).get("version")


def vendor_mounts(nm: Path) -> dict[str, Path]:
    """URL prefix -> folder for the pinned front-end packages (only these two are served)."""
    return {f"/vendor/{pkg}/": nm / pkg for pkg in LITERTJS_PACKAGES}
