"""Full-size GPU-check studies: slow (minutes each on SwiftShader), one at a time.

  python benchmarks/gpu_check_fullsize.py naive-encoder OUT_DIR
      upstream ``sam2`` image_encoder (random init) converted with litert-torch as-is -> gpu-check
  python benchmarks/gpu_check_fullsize.py rank-decoder RANK BUNDLE_DIR OUT_DIR
      our decoder with Rewrites(attention_rank=RANK) at the config's full size, converted into OUT_DIR next to
      copies of BUNDLE_DIR's encoder.tflite and host tables (so clicks use the bundle's features) -> gpu-check

Each prints the text report and writes OUT_DIR/gpu_check.json. The bundle export itself
(``sam2edge export --target litert``) records the GPU check of its own files in fidelity.json.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import torch
from torch import nn


class NaiveEncoder(nn.Module):
    """upstream ImageEncoder with its dict output flattened to a tuple (nothing else changed)."""

    def __init__(self, image_encoder: nn.Module) -> None:
        super().__init__()
        self.enc = image_encoder

    def forward(self, image):
        out = self.enc(image)
        return (out["vision_features"], *out["backbone_fpn"])


def _report(path: Path, out_dir: Path) -> None:
    from sam2edge.checks.gpu.check import check_file, environment
    from sam2edge.checks.gpu.report import format_report

    t = time.perf_counter()
    r = check_file(path)
    print(format_report(r))
    print(f"gpu-check took {time.perf_counter() - t:.0f} s")
    record = {"environment": environment(r.residency.device), "file": r.to_dict()}
    (out_dir / "gpu_check.json").write_text(json.dumps(record, indent=2) + "\n")


def naive_encoder(out_dir: Path) -> None:
    import litert_torch
    from sam2.build_sam import build_sam2

    out_dir.mkdir(parents=True, exist_ok=True)
    model = build_sam2("configs/sam2.1/sam2.1_hiera_t.yaml", ckpt_path=None, device="cpu").eval()
    path = out_dir / "naive_encoder.tflite"
    t = time.perf_counter()
    litert_torch.convert(NaiveEncoder(model.image_encoder).eval(), (torch.randn(1, 3, 1024, 1024),)).export(str(path))
    print(f"converted {path} in {time.perf_counter() - t:.0f} s")
    _report(path, out_dir)


def rank_decoder(rank: int, bundle: Path, out_dir: Path) -> None:
    from sam2edge.bundle import load_card
    from sam2edge.config import get_config
    from sam2edge.export.litert import convert_graph, graphs
    from sam2edge.model import Rewrites, build_sam2
    from sam2edge.runtime.backends.litert import CARD_CONST_FILE, DECODER_FILE, ENCODER_FILE, TABLE_FILES
    from sam2edge.weights import load_weights

    card = load_card(bundle)
    cfg = get_config(card["config"]).at_resolution(int(card["resolution"]))
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in (ENCODER_FILE, *TABLE_FILES, CARD_CONST_FILE):
        shutil.copy(bundle / f, out_dir / f)
    sd, _ = load_weights(card["source"]["checkpoint"] if card["source"]["format"] != "synthetic" else None, cfg)
    model = build_sam2(cfg, Rewrites(attention_rank=rank))
    model.load_state_dict(sd)
    module, kwargs = graphs(model, int(card["extra"]["num_tokens"]))[DECODER_FILE]
    t = time.perf_counter()
    convert_graph(module, kwargs, out_dir / DECODER_FILE, card["precision"])
    print(f"converted rank-{rank} decoder ({card['precision']}) in {time.perf_counter() - t:.0f} s")
    _report(out_dir / DECODER_FILE, out_dir)


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    if cmd == "naive-encoder":
        naive_encoder(Path(rest[0]))
    elif cmd == "rank-decoder":
        rank_decoder(int(rest[0]), Path(rest[1]), Path(rest[2]))
    else:
        sys.exit(__doc__)
