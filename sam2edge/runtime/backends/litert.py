"""LiteRT backend: runs a bundle written by ``sam2edge export --target litert`` with ai-edge-litert (CPU).

Bundle files (the layout an app or the browser demo consumes; e = S/16, C = d_model, K slots):

  encoder.tflite       in : image [1,3,S,S] float32, ImageNet-normalised RGB NCHW
                       out: image_embeddings [1,C,e,e] (no_mem added), feat_s0 [1,C/8,4e,4e],
                            feat_s1 [1,C/4,2e,2e]
  decoder.tflite       in : image_embeddings, feat_s0, feat_s1 (as above), sparse_prompt [1,K,C]
                            (host-encoded tokens), sparse_valid [1,K] (1 used slot, 0 ignored),
                            dense_prompt [1,C,e,e] (no_mask broadcast, or mask_encoder's output)
                       out: masks [1,3,4e,4e] multimask logits, iou_scores [1,3], single_mask [1,1,4e,4e],
                            single_iou [1,1], object_score [1,1] (object-presence logit)
  mask_encoder.tflite  in : mask_input [1,1,4e,4e] low-res logits of a previous answer
                       out: dense_prompt [1,C,e,e]
  decoder_prep.tflite  (role ``decoder-prep``, CPU only) in : image_embeddings, dense_prompt
                       out: image_q, image_k, image_v [1,e*e,C/2]: the decoder's first-layer image projections
  decoder_cpu.tflite   (role ``decoder-cpu``, CPU only) decoder.tflite's inputs + image_q, image_k, image_v;
                       CPU-friendly exact rewrites (``export.litert.CPU_DECODER_REWRITES``); same outputs. This
                       runtime runs decoder_prep once per image (and per mask input), decoder_cpu per click
  decoder_batched.tflite  (card role ``decoder-batched``) the decoder's inputs with sparse_prompt [B,K,C],
                       sparse_valid [B,K] (B fixed at export): outputs with B rows (``decode_batch``)
  *.bin host tables, raw little-endian float32 (TABLE_FILES): the card-001 ``prompt_encode_const.bin``
  (gaussian [2,C/2] | point_embed[1] [C] | not_a_point [C]) and every table the host prompt encoder needs.

Every graph is called by signature ``serving_default`` with inputs and outputs by NAME (the converter
orders signature entries alphabetically; card.json ``extra.io`` lists names, shapes and positions).
Prompts: ``runtime.prompts.encode_points`` turns points / box corners into the K tokens from the
tables alone; unused slots get sparse_valid 0 and change nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from sam2edge.bundle import open_bundle
from sam2edge.config import Sam2Config, get_config
from sam2edge.errors import UserError
from sam2edge.runtime.backends import Decoded, Features
from sam2edge.runtime.prompts import encode_points, no_mask_dense

ENCODER_FILE, DECODER_FILE, MASK_ENCODER_FILE = "encoder.tflite", "decoder.tflite", "mask_encoder.tflite"
# the same decoder built with CPU-friendly rewrites (transposed conv as a GEMM, matmul mask head): this CPU
# runtime loads it when the bundle has it; decoder.tflite is the GPU-clean graph (GPU delegate, browser)
DECODER_CPU_FILE = "decoder_cpu.tflite"
# the CPU decoder's prompt-independent work (export.wrappers.ImageProjectionsGraph): image_embeddings +
# dense_prompt -> image_q, image_k, image_v, run once per image (and per mask input), not per click
DECODER_PREP_FILE = "decoder_prep.tflite"
CPU_ONLY_FILES = frozenset({DECODER_CPU_FILE, DECODER_PREP_FILE})  # never linted as GPU graphs or GPU-checked
SIGNATURE = "serving_default"
DEFAULT_NUM_TOKENS = 8  # box corners + up to 5 points + 1 pad, or up to 7 points + 1 pad

# table file -> (key in runtime.prompts tables, shape as a function of C)
TABLE_FILES: dict[str, tuple[str, object]] = {
    "gaussian.bin": ("gaussian", lambda c: (2, c // 2)),
    "point_embed.bin": ("point_embed", lambda c: (4, c)),
    "not_a_point.bin": ("not_a_point", lambda c: (c,)),
    "no_mask.bin": ("no_mask", lambda c: (c,)),
}
BATCHED_DECODER_FILE = (
    "decoder_batched.tflite"  # sam2edge.export.batched: B token prompts per call (role decoder-batched)
)
CARD_CONST_FILE = "prompt_encode_const.bin"  # reference card 001: gaussian [2,C/2] | point_embed[1] | not_a_point


def card_const(tables: dict[str, np.ndarray]) -> np.ndarray:
    """The card-001 constants vector: gaussian.ravel() | point_embed[1] | not_a_point (float32)."""
    parts = (tables["gaussian"].ravel(), tables["point_embed"][1], tables["not_a_point"])
    return np.concatenate(parts).astype("<f4")


def write_tables(tables: dict[str, np.ndarray], folder: Path) -> dict[str, str]:
    """Write every host table as raw little-endian float32; returns file -> role for the card."""
    folder = Path(folder)
    for name, (key, _) in TABLE_FILES.items():
        np.ascontiguousarray(tables[key], dtype="<f4").tofile(folder / name)
    card_const(tables).tofile(folder / CARD_CONST_FILE)
    return {name: "prompt-table" for name in (*TABLE_FILES, CARD_CONST_FILE)}


def read_tables(folder: Path, d_model: int) -> dict[str, np.ndarray]:
    """Read the host tables back; a missing or mis-sized file is a one-line UserError."""
    out = {}
    for name, (key, shape_of) in TABLE_FILES.items():
        path = Path(folder) / name
        shape = shape_of(d_model)
        if not path.is_file():
            raise UserError(f"bundle {folder} lacks {name}; re-run `sam2edge export --target litert`")
        arr = np.fromfile(path, dtype="<f4")
        if arr.size != int(np.prod(shape)):
            raise UserError(f"{path} holds {arr.size} floats, expected {shape}; the bundle is corrupt, re-export it")
        out[key] = arr.reshape(shape).astype(np.float32)
    return out


def _interpreter(path: Path, num_threads: int):
    from ai_edge_litert.interpreter import Interpreter

    if not path.is_file():
        raise UserError(f"bundle file {path} is missing; re-run `sam2edge export --target litert`")
    head = path.read_bytes()[:8]
    if len(head) < 8 or head[4:8] != b"TFL3":
        raise UserError(f"{path} is not a .tflite flatbuffer; the bundle is corrupt, re-run the export")
    try:
        it = Interpreter(model_path=str(path), num_threads=num_threads)
        return it.get_signature_runner(SIGNATURE)
    except (ValueError, RuntimeError) as e:
        reason = str(e).strip().splitlines()[0][:100] if str(e).strip() else type(e).__name__
        raise UserError(f"LiteRT cannot load {path} ({reason}); the file is corrupt, re-run the export") from None


def check_unused_graphs(folder: Path, listed: set[str], loaded: set[str]) -> None:
    """Parse every .tflite the card lists that the CPU runtime does not run (``decoder.tflite``, the GPU
    program, when the CPU decoder is present): LiteRT must load it and build its signature, else one line
    naming the file. A phone's GPU delegate would otherwise be the first to find a damaged program."""
    for name in sorted(f for f in listed - loaded if f.endswith(".tflite")):
        _interpreter(folder / name, 1)


class LiteRTBackend:
    """encoder.tflite + decoder.tflite + mask_encoder.tflite + host tables, on the LiteRT CPU runtime."""

    name = "litert"

    def __init__(
        self,
        folder: str | Path,
        cfg: Sam2Config,
        num_tokens: int,
        num_threads: int | None = None,
        decoder: str | None = None,
        batched: str | None = None,
    ) -> None:
        """``decoder``: the decoder file to run; None = ``DECODER_CPU_FILE`` where the bundle has it, else
        ``DECODER_FILE`` (bundles written before the CPU decoder existed). ``batched``: the batched decoder
        file (``decode_batch``; None = single decodes)."""
        self.folder, self.cfg, self.num_tokens = Path(folder), cfg, num_tokens
        if decoder is None:
            decoder = DECODER_CPU_FILE if (self.folder / DECODER_CPU_FILE).is_file() else DECODER_FILE
        self.decoder_file, self.batched_file = decoder, batched
        threads = num_threads or min(4, os.cpu_count() or 1)
        self.tables = read_tables(self.folder, cfg.d_model)
        self._no_mask = no_mask_dense(self.tables, cfg.image_embedding_size)
        self._enc = _interpreter(self.folder / ENCODER_FILE, threads)
        self._dec = _interpreter(self.folder / decoder, threads)
        given = "image_q" in self._dec.get_input_details()  # the CPU decoder, given its image projections
        self._prep = _interpreter(self.folder / DECODER_PREP_FILE, threads) if given else None
        self._prep_key = str((self.folder / DECODER_PREP_FILE).resolve())  # Features.prepared: this bundle's
        self._mask = _interpreter(self.folder / MASK_ENCODER_FILE, threads)

    @classmethod
    def from_bundle(cls, folder: str | Path, *, threads: int | None = None) -> LiteRTBackend:
        """Open a bundle (card validated, artifacts' size + SHA-256 checked); ``threads`` None = min(4, CPUs)."""
        folder = Path(folder)
        card = open_bundle(folder, "litert")  # a truncated or edited file never reaches the runtime
        try:
            cfg = get_config(card["config"]).at_resolution(int(card["resolution"]))
            k = int(card.get("extra", {}).get("num_tokens", DEFAULT_NUM_TOKENS))
        except (ValueError, TypeError) as e:
            raise UserError(f"{folder}/card.json: {e}; re-run the export") from None
        listed = {a["file"] for a in card["artifacts"]}  # only a file the card lists (and checked) is run
        batched = next((a["file"] for a in card["artifacts"] if a.get("role") == "decoder-batched"), None)
        decoder = DECODER_CPU_FILE if DECODER_CPU_FILE in listed else DECODER_FILE
        backend = cls(folder, cfg, k, threads, decoder, batched)
        backend.check_shapes()
        check_unused_graphs(folder, listed, backend.loaded_files())
        return backend

    def loaded_files(self) -> set[str]:
        """The .tflite files this backend opened (the CPU runtime's graphs)."""
        files = {ENCODER_FILE, self.decoder_file, MASK_ENCODER_FILE}
        files |= {DECODER_PREP_FILE} if self._prep is not None else set()
        return files | ({self.batched_file} if self.batched_file else set())

    def check_shapes(self) -> None:
        """card.json's resolution and token count must be the graphs' (one line naming both when not)."""
        side = int(self._enc.get_input_details()["image"]["shape"][-1])
        slots = int(self._dec.get_input_details()["sparse_prompt"]["shape"][1])
        hint = "re-run `sam2edge export --target litert`"
        if side != self.cfg.image_size:
            raise UserError(
                f"{self.folder}/card.json says resolution {self.cfg.image_size}, but {ENCODER_FILE} takes "
                f"{side}x{side} images; {hint}"
            )
        if slots != self.num_tokens:
            raise UserError(
                f"{self.folder}/card.json says {self.num_tokens} prompt tokens, but {self.decoder_file} has "
                f"{slots}; {hint}"
            )

    def encode(self, image: np.ndarray) -> Features:
        """The encoder, then (a CPU decoder given its projections) ``decoder_prep.tflite`` for no mask input:
        the image's share of every click, paid once here."""
        out = self._enc(image=np.ascontiguousarray(image, dtype=np.float32))
        feats = Features(out["image_embeddings"], out["feat_s0"], out["feat_s1"])
        self._given(feats, None)
        return feats

    def _given(self, feats: Features, dense: np.ndarray | None) -> dict[str, np.ndarray]:
        """The decoder's image projections from ``decoder_prep.tflite``: for no mask input (``dense`` None)
        once per image, kept on ``feats.prepared``; for a mask input's dense prompt, per call. {} for a
        decoder that projects the image itself."""
        if self._prep is None:
            return {}
        if dense is not None:
            return self._prep(image_embeddings=feats.image_embed, dense_prompt=dense)
        if self._prep_key not in feats.prepared:  # keyed by the file: features shared with another bundle
            feats.prepared[self._prep_key] = self._prep(image_embeddings=feats.image_embed, dense_prompt=self._no_mask)
        return feats.prepared[self._prep_key]

    def encode_mask(self, mask_input: np.ndarray) -> np.ndarray:
        """mask_input 1x1x4ex4e logits -> dense_prompt 1xCxexe."""
        return self._mask(mask_input=np.ascontiguousarray(mask_input, dtype=np.float32))["dense_prompt"]

    def decode(self, feats: Features, coords: np.ndarray, labels: np.ndarray, mask_input: np.ndarray | None) -> Decoded:
        n = int(np.asarray(labels).size)
        if n > self.num_tokens:
            raise UserError(
                f"{n} prompt tokens (box corners + points + pad) exceed this bundle's {self.num_tokens} slots; "
                f"use at most {self.num_tokens - 1} points, or {self.num_tokens - 3} with a box"
            )
        tokens, valid = encode_points(coords[0], labels[0], self.tables, self.cfg.image_size, self.num_tokens)
        dense = None if mask_input is None else np.ascontiguousarray(self.encode_mask(mask_input), dtype=np.float32)
        out = self._dec(
            image_embeddings=feats.image_embed,
            feat_s0=feats.feat_s0,
            feat_s1=feats.feat_s1,
            sparse_prompt=tokens,
            sparse_valid=valid,
            dense_prompt=self._no_mask if dense is None else dense,
            **self._given(feats, dense),
        )
        return Decoded(out["masks"], out["iou_scores"], out["single_mask"], out["single_iou"], out["object_score"])

    # ---- batched decoder (card role ``decoder-batched``, ``decoder_batched.tflite``; "segment everything") ----
    def decode_batch(self, feats: Features, coords: np.ndarray, labels: np.ndarray) -> Decoded:
        """coords BxNx2, labels BxN (no mask input) -> Decoded with B rows, through ``decoder_batched.tflite``
        in chunks of its fixed batch (the last chunk padded by repeating its last row); a bundle without
        it runs B single decodes (``backends.decode_loop``)."""
        from sam2edge.runtime.backends import decode_loop

        if self.batched_file is None:
            return decode_loop(self, feats, coords, labels)
        if getattr(self, "_batched", None) is None:
            self._batched = _interpreter(self.folder / self.batched_file, min(4, os.cpu_count() or 1))
        shapes = {k: v["shape"] for k, v in self._batched.get_input_details().items()}
        batch, slots = (int(v) for v in shapes["sparse_prompt"][:2])
        rows = [encode_points(c, lab, self.tables, self.cfg.image_size, slots) for c, lab in zip(coords, labels)]
        tokens = np.concatenate([r[0] for r in rows])  # (N, K, C)
        valid = np.concatenate([r[1] for r in rows])  # (N, K)
        outs: list[dict] = []
        for start in range(0, len(tokens), batch):
            t, v = tokens[start : start + batch], valid[start : start + batch]
            n = len(t)
            pad = batch - n
            t = np.concatenate([t, np.repeat(t[-1:], pad, 0)])  # (B, K, C)
            v = np.concatenate([v, np.repeat(v[-1:], pad, 0)])  # (B, K)
            out = self._batched(
                image_embeddings=feats.image_embed,
                feat_s0=feats.feat_s0,
                feat_s1=feats.feat_s1,
                sparse_prompt=t,
                sparse_valid=v,
                dense_prompt=self._no_mask,
            )
            outs.append({k: a[:n] for k, a in out.items()})
        names = ("masks", "iou_scores", "single_mask", "single_iou", "object_score")
        return Decoded(*(np.concatenate([o[k] for o in outs]) for k in names))
