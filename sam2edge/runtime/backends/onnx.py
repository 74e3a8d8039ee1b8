"""ONNX Runtime backend: ``encoder.onnx`` + ``decoder.onnx`` of an ONNX bundle behind the backend API.

Graph contract (fp32 I/O for every precision; S = image size, e = S/16):
  encoder.onnx  image 1x3xSxS (ImageNet-normalised RGB, NCHW)
                -> image_embeddings 1xCxexe, feat_s0 1x(C/8)x4ex4e, feat_s1 1x(C/4)x2ex2e
  decoder.onnx  image_embeddings, feat_s0, feat_s1, point_coords 1xNx2 (X, Y) model-input pixels
                (dynamic N), point_labels 1xN (1 fg, 0 bg, 2/3 box corners, -1 pad, -2 ignored slot),
                mask_input 1x1x4ex4e logits, has_mask_input (1,) 0 or 1
                -> masks 1x3x4ex4e, iou_scores 1x3, single_mask 1x1x4ex4e, single_iou 1x1, object_score 1x1

int8 bundles may also hold ``encoder_vnni.onnx`` (role ``encoder-vnni``: u8 x s8 products, fast with VNNI and
saturating without it; ``sam2edge.export.onnx_int8``). ``from_bundle`` opens it where the CPU has VNNI, else
``encoder.onnx`` (``pick_encoder``; ``SAM2EDGE_ORT_ENCODER=portable`` always opens ``encoder.onnx``).

Execution providers: CPU by default. ``providers=`` (or the environment variable
``SAM2EDGE_ORT_PROVIDERS``, comma-separated, e.g. ``CUDAExecutionProvider,CPUExecutionProvider``)
selects any provider the installed onnxruntime has; ``threads=`` (or ``SAM2EDGE_ORT_THREADS``) sets
intra-op threads (0 = onnxruntime's default). Every bad input is a one-line ``UserError``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from sam2edge.bundle import open_bundle
from sam2edge.config import Sam2Config, get_config
from sam2edge.errors import UserError
from sam2edge.runtime.backends import Decoded, Features, padded_chunks

ENCODER_FILE, DECODER_FILE = "encoder.onnx", "decoder.onnx"
ENCODER_INPUTS = ("image",)
ENCODER_OUTPUTS = ("image_embeddings", "feat_s0", "feat_s1")
DECODER_INPUTS = (
    "image_embeddings",
    "feat_s0",
    "feat_s1",
    "point_coords",
    "point_labels",
    "mask_input",
    "has_mask_input",
)
DECODER_OUTPUTS = ("masks", "iou_scores", "single_mask", "single_iou", "object_score")
BATCHED_DECODER_FILE = "decoder_batched.onnx"  # optional: sam2edge.export.batched.BatchedPointDecoderGraph
BATCHED_INPUTS = ("image_embeddings", "feat_s0", "feat_s1", "point_coords", "point_labels")
LABELS = (-2.0, -1.0, 0.0, 1.0, 2.0, 3.0)  # ignored slot, pad, bg, fg, box top-left, box bottom-right
IGNORED_SLOT = -2.0
PROVIDERS_ENV, THREADS_ENV = "SAM2EDGE_ORT_PROVIDERS", "SAM2EDGE_ORT_THREADS"
VNNI_ENCODER_FILE, VNNI_ENCODER_ROLE = "encoder_vnni.onnx", "encoder-vnni"
ENCODER_ENV = "SAM2EDGE_ORT_ENCODER"  # "auto" (default): the VNNI encoder where it runs exactly; "portable"
VNNI_FLAGS = ("avx512_vnni", "avx_vnni")  # x86 flags of onnxruntime's u8 x s8 kernels with int32 sums
DEFAULT_PROVIDERS = ("CPUExecutionProvider",)


def resolve_providers(providers: list[str] | tuple[str, ...] | None = None) -> list[str]:
    """Explicit list, else ``$SAM2EDGE_ORT_PROVIDERS``, else CPU; each must exist in this onnxruntime."""
    import onnxruntime as ort

    if providers is None:
        env = os.environ.get(PROVIDERS_ENV, "").strip()
        providers = [p.strip() for p in env.split(",") if p.strip()] if env else list(DEFAULT_PROVIDERS)
    available = ort.get_available_providers()
    missing = [p for p in providers if p not in available]
    if missing or not providers:
        raise UserError(
            f"onnxruntime provider(s) {missing or providers} not available here; this onnxruntime has {available}"
            f" (set {PROVIDERS_ENV} to a comma-separated subset)"
        )
    return list(providers)


def resolve_threads(threads: int | None = None) -> int:
    """Explicit count, else ``$SAM2EDGE_ORT_THREADS``, else 0 (onnxruntime's default)."""
    if threads is None:
        env = os.environ.get(THREADS_ENV, "").strip()
        try:
            threads = int(env) if env else 0
        except ValueError:
            raise UserError(f"{THREADS_ENV}={env!r} is not a whole number; set it to e.g. 2, or unset it") from None
    if threads < 0:
        raise UserError(f"thread count {threads} is negative; use 0 (onnxruntime's default) or more")
    return threads


def has_vnni(cpuinfo: str | None = None) -> bool:
    """Whether this CPU (or the /proc/cpuinfo text ``cpuinfo``) names a VNNI flag; False where unreadable."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return any(f in flags for f in VNNI_FLAGS)


def pick_encoder(roles: set[str] | frozenset[str], vnni: bool | None = None) -> str:
    """The encoder role a bundle with artifact ``roles`` runs here: ``encoder-vnni`` when listed, the CPU has
    VNNI (``vnni``, default ``has_vnni()``) and ``$SAM2EDGE_ORT_ENCODER`` is not "portable"; else ``encoder``."""
    choice = os.environ.get(ENCODER_ENV, "auto").strip() or "auto"
    if choice not in ("auto", "portable"):
        raise UserError(f"{ENCODER_ENV}={choice!r}; set it to auto (the default) or portable, or unset it")
    if choice == "portable" or VNNI_ENCODER_ROLE not in roles:
        return "encoder"
    return VNNI_ENCODER_ROLE if (has_vnni() if vnni is None else vnni) else "encoder"


def make_session(
    path: str | Path, providers: list[str] | None = None, threads: int | None = None, optimize: bool = True
):
    """An onnxruntime InferenceSession for ``path``; a missing or corrupt file is a one-line UserError."""
    import onnxruntime as ort

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} does not exist; re-export the bundle with `sam2edge export --target onnx`")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = resolve_threads(threads)
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    provs = resolve_providers(providers)
    try:
        return ort.InferenceSession(str(path), so, providers=provs)
    except Exception as e:  # noqa: BLE001 - any load failure is a bad file to the user
        reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise UserError(
            f"cannot load {path}: {reason}; the file is corrupt or not ONNX, re-export the bundle"
        ) from None


def _check_array(name: str, a: object, shape: tuple[int | None, ...], dtypes: tuple[type, ...] = (np.float32,)) -> None:
    """Raise a one-line UserError unless ``a`` is a numpy array of one of ``dtypes`` and ``shape`` (None = any)."""
    if not isinstance(a, np.ndarray):
        raise UserError(f"{name} must be a numpy array, got {type(a).__name__}")
    want = "x".join("N" if s is None else str(s) for s in shape)
    if a.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, a.shape)):
        raise UserError(f"{name} must have shape {want}, got {'x'.join(map(str, a.shape)) or 'a scalar'}")
    if not any(a.dtype == d for d in dtypes):
        names = " or ".join(np.dtype(d).name for d in dtypes)
        raise UserError(f"{name} must be {names}, got {a.dtype}; cast it with .astype(np.float32)")
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        raise UserError(f"{name} holds NaN or Inf values; pass finite numbers")


class OnnxBackend:
    """encoder.onnx + decoder.onnx run by onnxruntime; same calls and results as ``EagerBackend``."""

    name = "onnx"
    encoder_role = "encoder"  # the card role of the encoder file it runs (``pick_encoder``)

    def __init__(self, encoder, decoder, cfg: Sam2Config) -> None:
        self.encoder, self.decoder, self.cfg = encoder, decoder, cfg
        self.providers = list(encoder.get_providers())
        got_in = tuple(i.name for i in decoder.get_inputs())
        got_enc = tuple(i.name for i in encoder.get_inputs())
        if got_in != DECODER_INPUTS or got_enc != ENCODER_INPUTS:
            raise UserError(
                f"ONNX graphs have inputs {got_enc} / {got_in}, expected {ENCODER_INPUTS} / {DECODER_INPUTS}"
            )

    @classmethod
    def from_files(
        cls,
        encoder: str | Path,
        decoder: str | Path,
        cfg: Sam2Config,
        providers: list[str] | None = None,
        threads: int | None = None,
    ) -> OnnxBackend:
        return cls(make_session(encoder, providers, threads), make_session(decoder, providers, threads), cfg)

    @classmethod
    def from_bundle(
        cls, folder: str | Path, *, threads: int | None = None, providers: list[str] | None = None
    ) -> OnnxBackend:
        """Open an ONNX bundle (card validated, artifacts' size + SHA-256 checked before loading)."""
        folder = Path(folder)
        card = open_bundle(folder, "onnx")
        by_role = {a.get("role"): a for a in card["artifacts"]}
        paths, encoder_role = [], pick_encoder(set(by_role))
        for role in (encoder_role, "decoder"):
            art = by_role.get(role)
            if art is None:
                raise UserError(f"{folder}/card.json lists no {role} artifact; re-export the bundle")
            paths.append(folder / art["file"])
        try:
            cfg = get_config(card["config"]).at_resolution(int(card["resolution"]))
        except ValueError as e:
            raise UserError(f"{folder}/card.json: {e}") from None
        backend = cls.from_files(paths[0], paths[1], cfg, providers, threads)
        backend.encoder_role = encoder_role
        side = backend.encoder.get_inputs()[0].shape[-1]
        if side != cfg.image_size:
            raise UserError(
                f"{folder}/card.json says resolution {cfg.image_size}, but {paths[0].name} takes {side}x{side} "
                "images; re-run `sam2edge export --target onnx`"
            )
        batched = by_role.get("decoder-batched")  # listed, so its size and SHA-256 were checked
        opened = {p.name for p in paths} | ({batched["file"]} if batched else set())
        for name in sorted({a["file"] for a in card["artifacts"]} - opened):  # shipped, not run on this CPU
            if name.endswith(".onnx"):  # e.g. the other encoder (VNNI / portable): a damaged one is named now
                make_session(folder / name, None, 1, optimize=False)
        return backend.attach_batched(folder / batched["file"]) if batched else backend

    def encode(self, image: np.ndarray) -> Features:
        """image 1x3xSxS float32, ImageNet-normalised -> decoder-ready features."""
        s = self.cfg.image_size
        _check_array("image", image, (1, 3, s, s))
        emb, s0, s1 = self.encoder.run(list(ENCODER_OUTPUTS), {"image": np.ascontiguousarray(image)})
        return Features(emb, s0, s1)

    def decode(self, feats: Features, coords: np.ndarray, labels: np.ndarray, mask_input: np.ndarray | None) -> Decoded:
        """coords 1xNx2 (X, Y) model-input pixels, labels 1xN, mask_input 1x1x4ex4e logits or None."""
        _check_array("point_coords", coords, (1, None, 2))
        _check_array("point_labels", labels, (1, coords.shape[1]), (np.float32, np.int32, np.int64))
        labels = labels.astype(np.float32)
        if not np.isin(labels, LABELS).all():
            raise UserError(
                f"point_labels must be in {[int(v) for v in LABELS]}, got {sorted(set(labels.ravel().tolist()))}"
            )
        if coords.shape[1] == 0:  # mask-only prompt: one ignored slot equals the empty prompt
            coords, labels = np.zeros((1, 1, 2), np.float32), np.full((1, 1), IGNORED_SLOT, np.float32)
        side = 4 * self.cfg.image_embedding_size
        if mask_input is None:
            mask, has = np.zeros((1, 1, side, side), np.float32), np.zeros((1,), np.float32)
        else:
            _check_array("mask_input", mask_input, (1, 1, side, side))
            mask, has = mask_input, np.ones((1,), np.float32)
        feed = dict(zip(DECODER_INPUTS, (feats.image_embed, feats.feat_s0, feats.feat_s1, coords, labels, mask, has)))
        feed = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in feed.items()}
        return Decoded(*self.decoder.run(list(DECODER_OUTPUTS), feed))

    # ---- batched decoder (card role ``decoder-batched``, ``decoder_batched.onnx``; "segment everything") ---
    batched = None  # onnxruntime session of sam2edge.export.batched.BatchedPointDecoderGraph (fixed B, N)

    def attach_batched(self, path: str | Path) -> OnnxBackend:
        """Use ``path`` (a BatchedPointDecoderGraph .onnx) for ``decode_batch``."""
        self.batched = make_session(path, self.providers)
        return self

    def decode_batch(self, feats: Features, coords: np.ndarray, labels: np.ndarray) -> Decoded:
        """coords BxNx2, labels BxN (no mask input) -> Decoded with B rows: the batched graph in chunks of its
        fixed batch (the last chunk padded by repeating its last row; prompts padded with ignored slots),
        else B single decodes."""
        from sam2edge.runtime.backends import decode_loop

        if self.batched is None:
            return decode_loop(self, feats, coords, labels)
        batch, slots = (int(d) for d in self.batched.get_inputs()[3].shape[:2])
        outs = []
        for p, q, k in padded_chunks(coords, labels, slots, batch, IGNORED_SLOT, np.float32):
            feed = dict(zip(BATCHED_INPUTS, (feats.image_embed, feats.feat_s0, feats.feat_s1, p, q)))
            feed = {key: np.ascontiguousarray(v, dtype=np.float32) for key, v in feed.items()}
            outs.append([a[:k] for a in self.batched.run(list(DECODER_OUTPUTS), feed)])
        return Decoded(*(np.concatenate([o[i] for o in outs]) for i in range(len(DECODER_OUTPUTS))))
