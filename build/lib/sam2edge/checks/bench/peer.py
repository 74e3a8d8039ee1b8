"""The peer's export as a bench subject: a stand-in for samexporter 0.5.0's ONNX export of SAM 2.1.

samexporter (github.com/vietanhdev/samexporter, ``samexporter/export_sam2.py``) wraps upstream Meta
``sam2``'s own modules in two ``nn.Module`` s, traces each with torch.onnx's TorchScript exporter
(``torch.onnx.utils.export``: opset 18, constant folding, no graph rewrites; ``--simplify`` is off by
default) and runs the two files with a plain onnxruntime ``InferenceSession``. samexporter itself is not a
dependency; this module rebuilds the same two graphs from the same upstream modules (``UpstreamImagePath``,
loaded with the weights the bundles were exported from), with the same inputs, outputs, operations and
exporter settings, so ``sam2edge bench --compare ... --peer DIR`` times a user's "naive" export beside ours.

Graphs (S = image size, e = S / 16 the embedding side):
- encoder: image 1x3xSxS (ImageNet-normalised RGB) -> high_res_feats_0 1x32x4ex4e, high_res_feats_1
  1x64x2ex2e, image_embed 1x256xexe (conv_s0 / conv_s1 applied, no_mem_embed added, as set_image does).
- decoder: image_embed, high_res_feats_0, high_res_feats_1, point_coords BxNx2 (model-input pixels, (X, Y),
  no pad point: the graph appends it), point_labels BxN (float: 1 fg, 0 bg, 2/3 box corners), mask_input
  Bx1x4ex4e, has_mask_input B -> masks Bx3x4ex4e (the three multimask logits, clamped to [-32, 32]),
  iou_predictions Bx3. B and N are dynamic.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from sam2edge.bundle import write_json
from sam2edge.checks.bench.records import PEER
from sam2edge.checks.fidelity.upstream import UpstreamImagePath, upstream_version
from sam2edge.config import Sam2Config
from sam2edge.errors import UserError
from sam2edge.io import atomic_dir

PEER_NAME = "samexporter 0.5.0 stand-in (upstream modules via torch.onnx, onnxruntime)"
PEER_OPSET = 18  # samexporter's --opset default
ENCODER_FILE, DECODER_FILE, INFO_FILE = "encoder.onnx", "decoder.onnx", "peer.json"
ENCODER_OUT = ("high_res_feats_0", "high_res_feats_1", "image_embed")
DECODER_IN = (
    "image_embed",
    "high_res_feats_0",
    "high_res_feats_1",
    "point_coords",
    "point_labels",
    "mask_input",
    "has_mask_input",
)
DECODER_OUT = ("masks", "iou_predictions")
DECODER_DYNAMIC = {
    "point_coords": {0: "num_labels", 1: "num_points"},
    "point_labels": {0: "num_labels", 1: "num_points"},
    "mask_input": {0: "num_labels"},
    "has_mask_input": {0: "num_labels"},
}


class PeerImageEncoder(nn.Module):
    """samexporter's ``SAM2ImageEncoder``: upstream image encoder + conv_s0/s1 + no_mem_embed, through
    upstream's flattened HWxNxC layout and back (the same reshapes and transposes it traces)."""

    def __init__(self, model: UpstreamImagePath) -> None:
        super().__init__()
        self.model = model
        self.num_feature_levels = 3  # SAM2Base.num_feature_levels of every SAM 2.1 config

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.model.image_encoder(x)
        fpn, pos = list(out["backbone_fpn"]), out["vision_pos_enc"]
        fpn[0] = self.model.sam_mask_decoder.conv_s0(fpn[0])
        fpn[1] = self.model.sam_mask_decoder.conv_s1(fpn[1])
        maps, pos = fpn[-self.num_feature_levels :], pos[-self.num_feature_levels :]
        sizes = [(p.shape[-2], p.shape[-1]) for p in pos]
        flat = [m.flatten(2).permute(2, 0, 1) for m in maps]  # NxCxHxW -> HWxNxC
        flat[-1] = flat[-1] + self.model.no_mem_embed
        feats = [f.permute(1, 2, 0).reshape(1, -1, *hw) for f, hw in zip(flat[::-1], sizes[::-1])][::-1]
        return feats[0], feats[1], feats[2]  # HWxNxC -> 1xCxHxW per level


class PeerImageDecoder(nn.Module):
    """samexporter's ``SAM2ImageDecoder`` (multimask_output=True): its own point and mask embedding over the
    upstream prompt encoder's weights, then upstream ``MaskDecoder.predict_masks``; masks 1-3, clamped."""

    def __init__(self, model: UpstreamImagePath, cfg: Sam2Config) -> None:
        super().__init__()
        self.model, self.image_size = model, cfg.image_size
        self.prompt_encoder, self.mask_decoder = model.sam_prompt_encoder, model.sam_mask_decoder

    @torch.no_grad()
    def forward(self, image_embed, feats_0, feats_1, point_coords, point_labels, mask_input, has_mask_input):
        sparse = self._embed_points(point_coords, point_labels)
        dense = self._embed_masks(mask_input, has_mask_input)
        masks, iou, _, _ = self.mask_decoder.predict_masks(
            image_embeddings=image_embed,
            image_pe=self.prompt_encoder.get_dense_pe(),
            sparse_prompt_embeddings=sparse,
            dense_prompt_embeddings=dense,
            repeat_image=False,
            high_res_features=[feats_0, feats_1],
        )
        return torch.clamp(masks[:, 1:, :, :], -32.0, 32.0), iou[:, 1:]

    def _embed_points(self, coords: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """BxNx2 model-input px, BxN -> Bx(N+1)x256 (pad point appended, label -1)."""
        coords = coords + 0.5
        coords = torch.cat([coords, torch.zeros((coords.shape[0], 1, 2), device=coords.device)], dim=1)
        labels = torch.cat([labels, -torch.ones((labels.shape[0], 1), device=labels.device)], dim=1)
        coords[:, :, 0] = coords[:, :, 0] / self.image_size
        coords[:, :, 1] = coords[:, :, 1] / self.image_size
        emb = self.prompt_encoder.pe_layer._pe_encoding(coords)
        labels = labels.unsqueeze(-1).expand_as(emb)
        emb = emb * (labels != -1)
        emb = emb + self.prompt_encoder.not_a_point_embed.weight * (labels == -1)
        for i in range(self.prompt_encoder.num_point_embeddings):
            emb = emb + self.prompt_encoder.point_embeddings[i].weight * (labels == i)
        return emb

    def _embed_masks(self, mask_input: torch.Tensor, has_mask_input: torch.Tensor) -> torch.Tensor:
        """Bx1x4ex4e, B -> Bx256xexe: the downscaled mask where given, no_mask_embed elsewhere."""
        emb = has_mask_input * self.prompt_encoder.mask_downscaling(mask_input)
        return emb + (1 - has_mask_input) * self.prompt_encoder.no_mask_embed.weight.reshape(1, -1, 1, 1)


def weights_digest(model: nn.Module) -> str:
    """SHA-256 over the module's state dict (names, shapes, float32 bytes) in name order."""
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(f"{k}:{tuple(v.shape)};".encode())
        h.update(v.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def file_digests(folder: str | Path) -> dict[str, str]:
    """SHA-256 of the two graph files in ``folder``."""
    return {f: hashlib.sha256((Path(folder) / f).read_bytes()).hexdigest() for f in (ENCODER_FILE, DECODER_FILE)}


def _config(cfg: Sam2Config) -> dict:
    """The config as peer.json stores it (tuples as lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def _trace(module: nn.Module, args: tuple, path: Path, names_in, names_out, dynamic) -> None:
    """torch.onnx's TorchScript exporter with samexporter's settings."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=False,
            export_params=True,
            opset_version=PEER_OPSET,
            do_constant_folding=True,
            input_names=list(names_in),
            output_names=list(names_out),
            dynamic_axes=dynamic,
        )


def export_peer(folder: str | Path, model: UpstreamImagePath, cfg: Sam2Config, source: dict) -> dict:
    """Write ``encoder.onnx``, ``decoder.onnx`` and ``peer.json`` (provenance) into a new ``folder``
    (atomically); ``source`` is the weights' provenance. Example inputs as samexporter's script makes them."""
    s, e = cfg.image_size, cfg.image_embedding_size
    g = torch.Generator().manual_seed(0)
    with atomic_dir(folder) as tmp:
        enc = PeerImageEncoder(model).eval()
        x = torch.randn(1, 3, s, s, generator=g)
        _trace(enc, (x,), tmp / ENCODER_FILE, ["image"], ENCODER_OUT, None)
        with torch.no_grad():
            f0, f1, embed = enc(x)
        coords = torch.randint(0, s, (1, 5, 2), generator=g).float()
        args = (embed, f0, f1, coords, torch.zeros(1, 5), torch.randn(1, 1, 4 * e, 4 * e, generator=g), torch.ones(1))
        _trace(PeerImageDecoder(model, cfg).eval(), args, tmp / DECODER_FILE, DECODER_IN, DECODER_OUT, DECODER_DYNAMIC)
        info = {
            "kind": "peer-export",
            "peer": PEER_NAME,
            "config": _config(cfg),
            "resolution": s,
            "opset": PEER_OPSET,
            "exporter": f"torch {torch.__version__} torch.onnx TorchScript exporter, do_constant_folding",
            "upstream": f"sam2 {upstream_version()}",
            "source": source,
            "weights_sha256": weights_digest(model),
            "files": file_digests(tmp),
        }
        write_json(tmp / INFO_FILE, info)
    return info


def check_peer_folder(folder: str | Path) -> None:
    """Before anything is loaded: ``folder`` is new (to be exported) or a peer export (one-line UserError)."""
    folder = Path(folder)
    if folder.exists() and not (folder / INFO_FILE).is_file():
        raise UserError(f"--peer {folder} exists and is not a peer export (no {INFO_FILE}); give a new folder")


def ensure_peer(folder: str | Path, model: UpstreamImagePath, cfg: Sam2Config, source: dict) -> dict:
    """The peer export in ``folder``: made there when the folder does not exist, else reused when its
    ``peer.json`` says it holds these weights at this size (a one-line UserError otherwise; never overwritten)."""
    folder = Path(folder)
    if not folder.exists():
        return export_peer(folder, model, cfg, source)
    try:
        info = json.loads((folder / INFO_FILE).read_text())
    except (OSError, ValueError):
        msg = f"--peer {folder} exists and is not a peer export (no readable {INFO_FILE}); give a new folder"
        raise UserError(msg) from None
    missing = [f for f in (ENCODER_FILE, DECODER_FILE) if not (folder / f).is_file()]
    if missing:
        raise UserError(f"--peer {folder} lacks {', '.join(missing)}; delete the folder or give a new one")
    if info.get("config") != _config(cfg) or info.get("weights_sha256") != weights_digest(model):
        raise UserError(
            f"--peer {folder} holds a {info.get('resolution')}px export of another model or other weights than"
            f" the bundles' ({cfg.image_size}px); give a new folder and it is exported from the bundles' weights"
        )
    return info


class PeerRunner:
    """The peer's two files in plain onnxruntime CPU sessions, with the bench interface (numpy in)."""

    name = PEER

    def __init__(self, folder: str | Path, cfg: Sam2Config, threads: int) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()  # default graph optimisation (ORT_ENABLE_ALL), as a user gets it
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        opts.log_severity_level = 3  # errors only: the traced Hiera's shape-merge warnings are noise
        folder, cpu = Path(folder), ["CPUExecutionProvider"]
        self.encoder = ort.InferenceSession(str(folder / ENCODER_FILE), opts, providers=cpu)
        self.decoder = ort.InferenceSession(str(folder / DECODER_FILE), opts, providers=cpu)
        self.cfg = cfg

    def encode(self, image: np.ndarray) -> dict[str, np.ndarray]:
        """1x3xSxS -> the three encoder outputs by name."""
        outs = self.encoder.run(None, {"image": np.ascontiguousarray(image, dtype=np.float32)})
        return dict(zip(ENCODER_OUT, outs))

    def decode(self, feats: dict, coords: np.ndarray, labels: np.ndarray, mask_input: np.ndarray | None = None):
        """coords 1xNx2 / labels 1xN in sam2edge's layout (a trailing pad point is dropped: the graph appends
        its own) -> (masks 1x3x4ex4e logits, iou 1x3)."""
        if labels.shape[1] and labels[0, -1] == -1:
            coords, labels = coords[:, :-1], labels[:, :-1]
        side = 4 * self.cfg.image_embedding_size
        mask = np.zeros((1, 1, side, side), np.float32) if mask_input is None else mask_input.astype(np.float32)
        feed = {
            "image_embed": feats["image_embed"],
            "high_res_feats_0": feats["high_res_feats_0"],
            "high_res_feats_1": feats["high_res_feats_1"],
            "point_coords": np.ascontiguousarray(coords, dtype=np.float32),
            "point_labels": np.ascontiguousarray(labels, dtype=np.float32),
            "mask_input": mask,
            "has_mask_input": np.array([0.0 if mask_input is None else 1.0], np.float32),
        }
        masks, iou = self.decoder.run(None, feed)
        return masks, iou
