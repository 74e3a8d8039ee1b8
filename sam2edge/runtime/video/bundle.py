"""Tracking from an export bundle: a ``VideoBackend`` over the video graphs of any target.

``sam2edge export --video`` adds three graphs to a bundle (file stem + the target's extension: .tflite,
.onnx, .pte) and one host table; S = image size, e = S/16, C = d_model, M = mem_dim, K = memory slots,
P = object-pointer slots, T = prompt-token slots (card.json ``extra.video``):

  memory_attention  vision [1,C,e,e] (raw FPN level, no no_mem_embed), mem_feats [K,M,e,e] (slot-major,
                    empty slots zeros), mem_tpos [1,K] (index into the temporal encodings), mem_valid [1,K],
                    ptrs [P,C], ptr_pos [1,P] (signed distance / t_max), ptr_valid [1,P] (1 filled, 0 empty),
                    rope_cos, rope_sin [HW,C] (``rope_tables.bin``; inputs, not constants: LiteRT's GPU
                    delegate computes RoPE wrongly from constant tables) -> pix_feat [1,C,e,e]
  memory_encoder    vision [1,C,e,e], low_res [1,1,4e,4e] mask logits, binarize [1,1] (1: point prompt),
                    score [1,1] object-score logit -> memory [1,M,e,e]
  video_decoder     pix_feat [1,C,e,e], feat_s0, feat_s1, sparse_prompt [1,T,C] (host-encoded tokens),
                    sparse_valid [1,T], mask_input [1,1,4e,4e], has_mask [1,1]
                    -> masks [1,4,4e,4e] (every mask token), iou_scores [1,4], object_score [1,1],
                       obj_ptrs [1,4,C] (no-object pointer mixed in where object_score <= 0)
  video_const.bin   float32 LE: no_mem_embed [C] | no_obj_ptr [C] | mask_downsample weight [4x4] | bias [1]
  rope_tables.bin   float32 LE: RoPE cos [HW,C] | sin [HW,C] (axial, row-major grid; memory_attention's inputs)
  + the prompt tables of ``runtime.backends.litert.TABLE_FILES`` (every target: the tokens are host-encoded)

EdgeTAM (a perceiver compresses each memory frame to N = L + G*G tokens): mem_feats is [K,N,M]; memory_attention
takes no ptr_pos (its pointers carry no temporal encoding) and two more tables, rope_cos_k, rope_sin_k [N,C] (one
memory frame's key rotation: identity rows for the L global latents, then the G x G grid), stored after the
frame tables in rope_tables.bin; memory_encoder takes no score but the perceiver's latents [N,M]
(``perceiver_latents.bin``, float32 LE; an input, not constants: see ``PerceiverResampler.forward``) and returns
memory [1,N,M] (``graph_io``).

Objects in one batch: a bundle also carries each graph at a fixed batch of ``VIDEO_BATCH`` = 4 objects (file stem
+ ``_b4``, role + ``-batched``; card.json ``extra.video.batch``): the same inputs, per-object ones with 4x the
rows (mem_feats [4K,...], mem_tpos / mem_valid [4,K], ptrs [4P,C], ptr_pos / ptr_valid [4,P], low_res, binarize,
score, pix_feat, sparse_prompt, sparse_valid, mask_input, has_mask: 4 rows), shared ones (vision, feat_s0, feat_s1,
the tables) as above. Objects run in chunks of 4 (5 objects: 4, then 1 through the single-object graph); fewer
than ``pad_from`` (default 4) objects run one per call, a chunk of at least ``pad_from`` is padded to 4 rows with
copies of its last object, whose rows are dropped (measured at 1024 px on 2 CPU threads: a padded row costs as much
as a real one, so by default only full chunks are batched). A bundle without batched
graphs runs every object through the single-object graphs.

The frame encoder is the bundle's image encoder (its output has no_mem_embed added; the host subtracts it).
One runner per target (``RUNNERS``) wraps that target's own session code; the memory bank, frame
selection and object bookkeeping stay in ``video_predictor`` / ``memory_bank``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np

from sam2edge.bundle import load_card
from sam2edge.config import Sam2Config, Sam2VideoConfig, get_config, get_video_config
from sam2edge.errors import UserError
from sam2edge.runtime.backends.litert import read_tables
from sam2edge.runtime.prompts import encode_points
from sam2edge.runtime.video.backend import FrameFeatures, MemoryInputs, VideoDecoded

# role -> (file stem, input names in call order, output names)
VIDEO_GRAPHS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "memory-attention": (
        "memory_attention",
        ("vision", "mem_feats", "mem_tpos", "mem_valid", "ptrs", "ptr_pos", "ptr_valid", "rope_cos", "rope_sin"),
        ("pix_feat",),
    ),
    "memory-encoder": ("memory_encoder", ("vision", "low_res", "binarize", "score"), ("memory",)),
    "video-decoder": (
        "video_decoder",
        ("pix_feat", "feat_s0", "feat_s1", "sparse_prompt", "sparse_valid", "mask_input", "has_mask"),
        ("masks", "iou_scores", "object_score", "obj_ptrs"),
    ),
}
EXTENSIONS = {"litert": ".tflite", "onnx": ".onnx", "executorch": ".pte"}
VIDEO_BATCH = 4  # objects per call of the batched video graphs
BATCHED = "-batched"  # role suffix of a video graph at VIDEO_BATCH objects (file stem suffix: _b4)
# inputs every object of a frame shares (one row in every graph); all other inputs have one row block per object
SHARED_INPUTS = frozenset(
    {"vision", "feat_s0", "feat_s1", "rope_cos", "rope_sin", "rope_cos_k", "rope_sin_k", "latents"}
)
CONST_FILE = "video_const.bin"
ROPE_FILE = "rope_tables.bin"  # float32 LE: RoPE cos [HW, C] | sin [HW, C], memory_attention's last two inputs
LATENTS_FILE = "perceiver_latents.bin"  # float32 LE: EdgeTAM's perceiver latents [N, M], memory_encoder's input
DEFAULT_VIDEO_TOKENS = 8  # prompt-token slots of video_decoder: box corners + points + 1 pad
Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def graph_io(role: str, vcfg: Sam2VideoConfig) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """``VIDEO_GRAPHS[role]`` for a video config: EdgeTAM's memory attention drops ``ptr_pos`` (no pointer
    temporal encoding) and adds the per-slot key tables (RoPEAttentionv2); its memory encoder drops ``score``
    (no no-object embedding)."""
    stem, ins, outs = VIDEO_GRAPHS[role.removesuffix(BATCHED)]
    role = role.removesuffix(BATCHED)
    if role == "memory-encoder" and not vcfg.no_obj_embed_spatial:
        ins = tuple(n for n in ins if n != "score")
    if role == "memory-encoder" and vcfg.memory_tokens:
        ins += ("latents",)
    if role == "memory-attention":
        ins = tuple(n for n in ins if n != "ptr_pos" or vcfg.ptr_tpos_enc)
        ins += ("rope_cos_k", "rope_sin_k") if vcfg.cross_rope_k_grid else ()
    return stem, ins, outs


def video_file(target: str, role: str) -> str:
    """The file of a video graph (``role`` + ``BATCHED``: the graph at ``VIDEO_BATCH`` objects)."""
    suffix = f"_b{VIDEO_BATCH}" if role.endswith(BATCHED) else ""
    return VIDEO_GRAPHS[role.removesuffix(BATCHED)][0] + suffix + EXTENSIONS[target]


def outputs(role: str) -> tuple[str, ...]:
    """Output names of a video graph (the batched graph's equal the single-object one's)."""
    return VIDEO_GRAPHS[role.removesuffix(BATCHED)][2]


def const_layout(c: int) -> dict[str, tuple[int, int]]:
    """video_const.bin: name -> (offset, count) in float32 values."""
    sizes = {"no_mem_embed": c, "no_obj_ptr": c, "mask_downsample_weight": 16, "mask_downsample_bias": 1}
    out, at = {}, 0
    for name, n in sizes.items():
        out[name], at = (at, n), at + n
    return out


def read_const(folder: Path, c: int) -> dict[str, np.ndarray]:
    path = Path(folder) / CONST_FILE
    layout = const_layout(c)
    total = sum(n for _, n in layout.values())
    arr = np.fromfile(path, dtype="<f4") if path.is_file() else np.zeros(0, "<f4")
    if arr.size != total:
        raise UserError(f"{path} holds {arr.size} floats, expected {total}; re-export the bundle with --video")
    return {k: arr[o : o + n].astype(np.float32) for k, (o, n) in layout.items()}


def read_rope(folder: Path, hw: int, c: int, n_k: int = 0) -> tuple[np.ndarray, ...]:
    """(cos, sin) [hw, c], then with ``n_k`` the key tables (cos_k, sin_k) [n_k, c]."""
    path = Path(folder) / ROPE_FILE
    arr = np.fromfile(path, dtype="<f4") if path.is_file() else np.zeros(0, "<f4")
    want = 2 * (hw + n_k) * c
    if arr.size != want:
        raise UserError(f"{path} holds {arr.size} floats, expected {want}; re-export the bundle with --video")
    arr = arr.astype(np.float32)
    frame = arr[: 2 * hw * c].reshape(2, hw, c)
    keys = arr[2 * hw * c :].reshape(2, n_k, c) if n_k else ()
    return tuple(np.ascontiguousarray(t) for t in (*frame, *keys))


def read_latents(folder: Path, vcfg: Sam2VideoConfig) -> np.ndarray:
    path = Path(folder) / LATENTS_FILE
    arr = np.fromfile(path, dtype="<f4") if path.is_file() else np.zeros(0, "<f4")
    n, m = vcfg.memory_tokens, vcfg.mem_dim
    if arr.size != n * m:
        raise UserError(f"{path} holds {arr.size} floats, expected {n * m}; re-export the bundle with --video")
    return np.ascontiguousarray(arr.astype(np.float32).reshape(n, m))


def _litert_runner(path: Path, role: str, threads: int | None) -> Runner:
    from sam2edge.runtime.backends.litert import _interpreter

    sig = _interpreter(path, threads or 1)
    return lambda feed: sig(**feed)


def _onnx_runner(path: Path, role: str, threads: int | None) -> Runner:
    from sam2edge.runtime.backends.onnx import make_session

    sess = make_session(path, threads=threads)
    names = list(outputs(role))
    return lambda feed: dict(zip(names, sess.run(names, feed)))


def _executorch_runner(path: Path, role: str, threads: int | None) -> Runner:
    import torch

    from sam2edge.runtime.backends.executorch import load_method

    method = load_method(path, "re-run `sam2edge export --target executorch --video`")
    outs = outputs(role)

    def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:  # feed: the graph's inputs in call order
        res = method.execute([torch.from_numpy(v) for v in feed.values()])
        return {n: t.numpy().copy() for n, t in zip(outs, res)}

    return run


# target -> fn(path, role, threads) -> Runner: each wraps that target's own session code
RUNNERS: dict[str, Callable[[Path, str, int | None], Runner]] = {
    "litert": _litert_runner,
    "onnx": _onnx_runner,
    "executorch": _executorch_runner,
}


class GraphRunners(Mapping[str, Runner]):
    """role -> Runner for one bundle's three video graphs, each loaded on first use: a caller that runs only
    some of them (``serve``: the page runs the graphs, the server only the frame encoder) loads no others.
    The files' SHA-256 are checked when the bundle is opened; a graph its runtime refuses is reported at its
    first call."""

    def __init__(self, target: str, folder: Path, threads: int | None) -> None:
        self.target, self.folder, self.threads = target, Path(folder), threads
        self._loaded: dict[str, Runner] = {}

    def __getitem__(self, role: str) -> Runner:
        if role not in self._loaded:
            path = self.folder / video_file(self.target, role)  # KeyError for a role that is not a video graph
            self._loaded[role] = RUNNERS[self.target](path, role, self.threads)
        return self._loaded[role]

    def __iter__(self) -> Iterator[str]:
        return iter(VIDEO_GRAPHS)

    def __len__(self) -> int:
        return len(VIDEO_GRAPHS)

    def loaded(self) -> tuple[str, ...]:
        """The roles whose runtime session exists, in load order."""
        return tuple(self._loaded)


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


class BundleVideoBackend:
    """``VideoBackend`` over an image backend (frame encoder) and the video graphs of one target; ``batch``: the
    objects per call of the bundle's batched graphs (1: none, every object through the single-object graphs)."""

    def __init__(self, image, target: str, folder: Path, cfg: Sam2Config, vcfg: Sam2VideoConfig, **kw) -> None:
        self.image, self.cfg, self.vcfg, self.name = image, cfg, vcfg, f"{target}-bundle"
        self.num_tokens = int(kw.get("num_tokens") or DEFAULT_VIDEO_TOKENS)
        self.batch = int(kw.get("batch") or 1)
        # a chunk of at least pad_from objects goes through the batched graph, padded to ``batch`` rows; smaller
        # ones run one object per call (on CPUs a padded row costs as much as a real one: docs/video.md)
        self.pad_from = int(kw.get("pad_from") or self.batch)
        threads = kw.get("threads")
        self.run = GraphRunners(target, folder, threads)
        self.tables = read_tables(folder, cfg.d_model)
        self.const = read_const(folder, cfg.d_model)
        self.no_obj_ptr = self.const["no_obj_ptr"].reshape(1, -1)
        self._no_mem = self.const["no_mem_embed"].reshape(1, -1, 1, 1)
        self.rope = read_rope(folder, cfg.image_embedding_size**2, cfg.d_model, vcfg.memory_tokens or 0)
        self.inputs = {role: graph_io(role, vcfg)[1] for role in VIDEO_GRAPHS}
        self.latents = read_latents(folder, vcfg) if vcfg.memory_tokens else None

    def encode_frame(self, image: np.ndarray) -> FrameFeatures:
        f = self.image.encode(_f32(image))
        return FrameFeatures(_f32(f.image_embed - self._no_mem), _f32(f.feat_s0), _f32(f.feat_s1))

    def no_memory(self, vision: np.ndarray) -> np.ndarray:
        return vision + self._no_mem

    def _objects(self, role: str, given: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
        """Run ``role`` for n objects: chunks of ``batch`` objects through the batched graph (a short chunk padded
        with copies of its last object) if it holds at least ``pad_from`` objects, else one object per call through
        the single-object graph; outputs n rows."""
        parts, i = [], 0
        while i < n:
            m = min(self.batch, n - i)
            m, rows = (m, self.batch) if m >= max(2, self.pad_from) else (1, 1)
            feed = {}
            for name in self.inputs[role]:
                a = given[name]
                if name not in SHARED_INPUTS:
                    r = a.shape[0] // n  # rows per object
                    a = a[i * r : (i + m) * r]
                    a = np.concatenate([a, *[a[-r:]] * (rows - m)]) if rows > m else a
                feed[name] = _f32(a)
            out = self.run[role + BATCHED if rows > 1 else role](feed)
            parts.append({k: v[:m] for k, v in out.items()})
            i += m
        return {k: np.concatenate([p[k] for p in parts]) if len(parts) > 1 else parts[0][k] for k in parts[0]}

    def memory_attention(self, vision: np.ndarray, mem: MemoryInputs) -> np.ndarray:
        given = {**vars(mem), "vision": vision}
        given.update(zip(("rope_cos", "rope_sin", "rope_cos_k", "rope_sin_k"), self.rope))
        return self._objects("memory-attention", given, mem.mem_tpos.shape[0])["pix_feat"]

    def decode(self, pix_feat, feats: FrameFeatures, coords, labels, mask_input) -> VideoDecoded:
        """coords BxNx2 model-input px, labels BxN (the predictor's layout, pad included) -> all 4 tokens."""
        n_obj, n = np.asarray(labels).shape
        if n > self.num_tokens:
            raise UserError(
                f"{n} prompt tokens (box corners + points + pad) exceed this bundle's {self.num_tokens} video "
                f"prompt slots; use at most {self.num_tokens - 1} points on a frame"
            )
        enc = [
            encode_points(coords[b], labels[b], self.tables, self.cfg.image_size, self.num_tokens) for b in range(n_obj)
        ]
        side = 4 * self.cfg.image_embedding_size
        mask = np.zeros((n_obj, 1, side, side), np.float32) if mask_input is None else mask_input
        has = np.full((n_obj, 1), 0.0 if mask_input is None else 1.0, np.float32)
        tokens, valid = np.concatenate([t for t, _ in enc]), np.concatenate([v for _, v in enc])
        args = (pix_feat, feats.feat_s0, feats.feat_s1, tokens, valid, mask, has)
        out = self._objects("video-decoder", dict(zip(VIDEO_GRAPHS["video-decoder"][1], args)), n_obj)
        return VideoDecoded(out["masks"], out["iou_scores"], out["object_score"], out["obj_ptrs"])

    def encode_memory(self, vision: np.ndarray, low_res: np.ndarray, binarize: bool, score: np.ndarray) -> np.ndarray:
        n = low_res.shape[0]
        b = np.full((n, 1), 1.0 if binarize else 0.0, np.float32)
        given = {"vision": vision, "low_res": low_res, "binarize": b, "score": _f32(score).reshape(n, 1)}
        given["latents"] = self.latents
        return self._objects("memory-encoder", given, n)["memory"]

    def downsample_mask(self, mask: np.ndarray) -> np.ndarray:
        """mask 1x1xSxS -> 1x1x(S/4)x(S/4): the 4x4 stride-4 convolution, on the host."""
        s4 = self.cfg.image_size // 4
        blocks = _f32(mask).reshape(s4, 4, s4, 4)  # (S/4, 4, S/4, 4)
        w = self.const["mask_downsample_weight"].reshape(4, 4)
        out = np.einsum("aibj,ij->ab", blocks, w) + self.const["mask_downsample_bias"][0]
        return _f32(out.reshape(1, 1, s4, s4))


def open_video_bundle(folder: str | Path, *, threads: int | None = None, image=None) -> tuple[BundleVideoBackend, dict]:
    """(backend, card) for a bundle exported with ``--video`` (artifacts checked before loading); ``image``:
    this bundle's image backend when the caller already holds one (the frame encoder), else loaded here."""
    from sam2edge.runtime.backends import backend_for

    folder = Path(folder)
    card = load_card(folder)
    target, video = card.get("target"), card.get("extra", {}).get("video")
    if target not in RUNNERS:
        raise UserError(f"{folder}: tracking runs from {', '.join(RUNNERS)} bundles, not {target!r}")
    if not isinstance(video, dict):
        raise UserError(f"{folder} has no video graphs; re-export it with `sam2edge export ... --video`")
    if image is None:
        image = backend_for(target).from_bundle(folder, threads=threads)  # card + every artifact's SHA-256
    try:
        cfg = get_config(card["config"]).at_resolution(int(card["resolution"]))
        vcfg = get_video_config(card["config"], cfg.image_size)
    except (ValueError, TypeError) as e:
        raise UserError(f"{folder}/card.json: {e}; re-run the export") from None
    kw = {"threads": threads, "num_tokens": video.get("num_tokens"), "batch": video.get("batch")}
    return BundleVideoBackend(image, target, folder, cfg, vcfg, **kw), card
