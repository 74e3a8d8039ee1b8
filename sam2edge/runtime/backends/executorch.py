"""ExecuTorch backend: runs a bundle written by ``sam2edge export --target executorch`` (XNNPACK, CPU).

Bundle files (reference card 002's contract; e = S/16, C = d_model, all I/O float32 but labels):

  encoder.pte  forward(image [1,3,S,S] ImageNet-normalised RGB NCHW)
               -> image_embed [1,C,e,e] (no_mem added), feat_s0 [1,C/8,4e,4e], feat_s1 [1,C/4,2e,2e]
  decoder.pte  forward(image_embed, feat_s0, feat_s1, points [1,1,K,2] (X, Y) model-input pixels,
                       labels [1,1,K] int64 (1 fg, 0 bg, 2/3 box corners, -1 pad, -2 ignored slot),
                       mask_input [1,1,4e,4e] logits, has_mask_input [1] (0.0 or 1.0))
               -> masks [1,3,4e,4e], iou_scores [1,3], single_mask [1,1,4e,4e], single_iou [1,1],
                  object_score [1,1]

  decoder_batched.pte  (card role ``decoder-batched``, optional) forward(image_embed, feat_s0, feat_s1,
                       points [B,N,2], labels [B,N] int64) with B, N fixed at export (card ``extra.batch``)
               -> the decoder's outputs with B rows, no mask input (``decode_batch``; "segment everything")

  decoder_prep.pte     (card role ``decoder-prep``, optional) forward(image_embed, mask_input, has_mask_input)
               -> image_q, image_k, image_v [1,e*e,Ci]: the decoder's first-layer image projections
  decoder_cpu.pte      (card role ``decoder-cpu``, with the prep) forward(decoder.pte's inputs, image_q, image_k,
                       image_v) -> decoder.pte's outputs. Where a bundle has both, the runtime runs the prep once
                       per image (``encode``; and per mask input) and decoder_cpu.pte per click; decoder.pte stays
                       the contract program for apps that run one decoder.

K is ``MAX_POINTS`` (16, card.json ``extra.max_points``): a prompt of N <= K entries (box corners, points,
and the one padding point upstream appends) fills the first N slots and the rest are label -2, which the
decoder removes from attention, so the answer is exactly that of the N-entry prompt.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from sam2edge.bundle import open_bundle
from sam2edge.config import Sam2Config, get_config
from sam2edge.errors import UserError
from sam2edge.model.mask_decoder import ImageProjections
from sam2edge.runtime.backends import Decoded, Features, padded_chunks

ENCODER_FILE, DECODER_FILE = "encoder.pte", "decoder.pte"
BATCHED_DECODER_FILE = "decoder_batched.pte"  # export.executorch_graphs.XnnBatchedDecoderGraph (role decoder-batched)
DECODER_PREP_FILE = "decoder_prep.pte"  # XnnImageProjectionsGraph (role decoder-prep)
DECODER_CPU_FILE = "decoder_cpu.pte"  # XnnGivenDecoderGraph (role decoder-cpu), given the prep's projections
MAX_POINTS = 16
IMAGE_PROJECTIONS = ImageProjections._fields  # decoder_prep.pte's outputs, in order (image_q, image_k, image_v)
IGNORED = -2


def load_method(path: Path, hint: str):
    """Load ``forward`` of a .pte; a missing or unreadable program is a one-line UserError."""
    from executorch.runtime import Runtime

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} is missing; {hint}")
    try:
        return Runtime.get().load_program(path).load_method("forward")
    except Exception as e:  # noqa: BLE001 - any loader failure means a bad file for the user
        reason = (str(e).splitlines() or [type(e).__name__])[0][:100]
        raise UserError(f"{path} is not a loadable ExecuTorch program ({reason}); {hint}") from None


def pad_prompt(coords: np.ndarray, labels: np.ndarray, slots: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """coords 1xNx2, labels 1xN -> points 1x1xKx2 float32, labels 1x1xK int64 (slots N.. ignored)."""
    c = np.asarray(coords, np.float32).reshape(-1, 2)
    lab = np.asarray(labels).reshape(-1)
    n = len(lab)
    if n == 0:
        raise UserError("no prompt: give at least one point or a box")
    if n > slots:
        raise UserError(
            f"{n} prompt points (box corners + clicks + 1 padding point) exceed the decoder's {slots}; "
            f"use at most {slots - 1} clicks, or {slots - 3} with a box"
        )
    if len(c) != n:
        raise UserError(f"{len(c)} points but {n} labels; give one label per point")
    pts = np.zeros((1, 1, slots, 2), np.float32)
    pts[0, 0, :n] = c
    lab_out = np.full((1, 1, slots), IGNORED, np.int64)
    lab_out[0, 0, :n] = np.rint(lab).astype(np.int64)
    return pts, lab_out


def check_image(image: np.ndarray, size: int) -> np.ndarray:
    x = np.asarray(image)
    if x.shape != (1, 3, size, size):
        raise UserError(f"encoder input must be a [1,3,{size},{size}] float32 image, got shape {list(x.shape)}")
    return np.ascontiguousarray(x, np.float32)


class ExecuTorchBackend:
    """Two .pte programs under the ExecuTorch runtime (XNNPACK delegate, portable kernels for the rest)."""

    name = "executorch"

    def __init__(
        self,
        folder: Path,
        cfg: Sam2Config,
        max_points: int = MAX_POINTS,
        batched: str | None = None,
        decoder: str | None = None,
    ) -> None:
        """``batched``: the batched decoder's file in ``folder`` (``decode_batch``; None = single decodes).
        ``decoder``: the per-click program; None = ``DECODER_CPU_FILE`` where the folder has it and its prep,
        else ``DECODER_FILE``. ``DECODER_CPU_FILE`` runs with ``DECODER_PREP_FILE``."""
        folder = Path(folder)
        hint = "re-run `sam2edge export --target executorch`"
        if decoder is None:
            pair = (folder / DECODER_CPU_FILE, folder / DECODER_PREP_FILE)
            decoder = DECODER_CPU_FILE if all(f.is_file() for f in pair) else DECODER_FILE
        self.cfg, self.max_points, self.decoder_file = cfg, max_points, decoder
        self.encoder = load_method(folder / ENCODER_FILE, hint)
        self.decoder = load_method(folder / decoder, hint)
        self.prep = load_method(folder / DECODER_PREP_FILE, hint) if decoder == DECODER_CPU_FILE else None
        self._prep_key = str((folder / DECODER_PREP_FILE).resolve())  # Features.prepared: this bundle's
        self.batched = load_method(folder / batched, hint) if batched else None

    @classmethod
    def from_bundle(cls, folder: str | Path, *, threads: int | None = None) -> ExecuTorchBackend:
        """Open a bundle (card validated, artifacts' size + SHA-256 checked). ``threads``: accepted for the
        common protocol; ExecuTorch's XNNPACK threadpool is sized by the runtime itself."""
        card = open_bundle(folder, "executorch")
        cfg = get_config(card["config"]).at_resolution(int(card["resolution"]))
        roles = {a.get("role"): a["file"] for a in card["artifacts"]}  # only a file the card lists is run
        given = roles.get("decoder-cpu") == DECODER_CPU_FILE and roles.get("decoder-prep") == DECODER_PREP_FILE
        points = int(card.get("extra", {}).get("max_points", MAX_POINTS))
        decoder = DECODER_CPU_FILE if given else DECODER_FILE
        backend = cls(Path(folder), cfg, points, roles.get("decoder-batched"), decoder)
        backend.check_shapes(folder)
        opened = {ENCODER_FILE, decoder, roles.get("decoder-batched")} | ({DECODER_PREP_FILE} if given else set())
        for name in sorted({a["file"] for a in card["artifacts"]} - opened):  # shipped but not run here
            if name.endswith(".pte"):  # e.g. decoder.pte beside the CPU pair: parsed so a damaged one is named
                load_method(Path(folder) / name, "re-run `sam2edge export --target executorch`")
        return backend

    def check_shapes(self, folder: str | Path) -> None:
        """card.json's resolution must be the encoder program's input side (one line when they disagree)."""
        try:
            sizes = tuple(self.encoder.metadata.input_tensor_meta(0).sizes())
        except (AttributeError, RuntimeError):  # older runtimes: no metadata to check against
            return
        if sizes[-1] != self.cfg.image_size:
            raise UserError(
                f"{folder}/card.json says resolution {self.cfg.image_size}, but {ENCODER_FILE} takes "
                f"{sizes[-1]}x{sizes[-1]} images; re-run `sam2edge export --target executorch`"
            )

    def encode(self, image: np.ndarray) -> Features:
        """The encoder, then (a bundle with ``DECODER_PREP_FILE``) the decoder's image projections for no mask
        input: the image's share of every click, paid once here."""
        x = torch.from_numpy(check_image(image, self.cfg.image_size))
        emb, s0, s1 = (t.numpy().copy() for t in self.encoder.execute([x]))
        feats = Features(emb, s0, s1)
        self._given(feats, None)
        return feats

    def _mask(self, mask_input: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """(mask_input, has_mask_input) as the programs take them: zeros and 0.0 for no mask input."""
        if mask_input is None:
            side = 4 * self.cfg.image_embedding_size
            return np.zeros((1, 1, side, side), np.float32), np.zeros((1,), np.float32)
        return np.ascontiguousarray(mask_input, np.float32), np.ones((1,), np.float32)

    def _given(self, feats: Features, mask_input: np.ndarray | None) -> list[np.ndarray]:
        """The prep program's image_q, image_k, image_v: for no mask input once per image (kept on
        ``feats.prepared``, so features from elsewhere get them on their first click), for a mask input per
        call; [] for a decoder that projects the image itself."""
        if self.prep is None:
            return []
        if mask_input is None and self._prep_key in feats.prepared:
            return list(feats.prepared[self._prep_key].values())
        ins = [feats.image_embed, *self._mask(mask_input)]
        outs = [t.numpy().copy() for t in self.prep.execute([torch.from_numpy(np.ascontiguousarray(a)) for a in ins])]
        if mask_input is None:
            feats.prepared[self._prep_key] = dict(zip(IMAGE_PROJECTIONS, outs, strict=True))
        return outs

    def decode(self, feats: Features, coords: np.ndarray, labels: np.ndarray, mask_input: np.ndarray | None) -> Decoded:
        pts, lab = pad_prompt(coords, labels, self.max_points)
        ins = [feats.image_embed, feats.feat_s0, feats.feat_s1, pts, lab, *self._mask(mask_input)]
        ins += self._given(feats, mask_input)
        outs = self.decoder.execute([torch.from_numpy(np.ascontiguousarray(a)) for a in ins])
        return Decoded(*(t.numpy().copy() for t in outs))

    # ---- batched decoder (card role ``decoder-batched``, ``decoder_batched.pte``; "segment everything") ----
    def decode_batch(self, feats: Features, coords: np.ndarray, labels: np.ndarray) -> Decoded:
        """coords BxNx2, labels BxN (no mask input) -> Decoded with B rows: the batched program in chunks of
        its fixed batch (the last chunk padded by repeating its last row; prompts padded with ignored
        slots), else B single decodes."""
        from sam2edge.runtime.backends import decode_loop

        if self.batched is None:
            return decode_loop(self, feats, coords, labels)
        batch, slots = (int(d) for d in self.batched.metadata.input_tensor_meta(3).sizes()[:2])
        image = [torch.from_numpy(np.ascontiguousarray(a)) for a in (feats.image_embed, feats.feat_s0, feats.feat_s1)]
        outs = []
        for p, q, k in padded_chunks(coords, np.rint(labels), slots, batch, IGNORED, np.int64):
            res = self.batched.execute([*image, torch.from_numpy(p), torch.from_numpy(q)])
            outs.append([t.numpy()[:k].copy() for t in res])
        return Decoded(*(np.concatenate([o[i] for o in outs]) for i in range(len(outs[0]))))
