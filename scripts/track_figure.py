"""Render the README's tracking figure: ``sam2edge track`` on a clip made from a real photo, frames tiled.

No real checkpoint can be downloaded here, so the weights are the synthetic (random) Hiera-Tiny video weights with
the object-score head's bias lifted (as the parity tests do: random weights otherwise answer "no object" and blank
every mask). The figure shows what the command writes, not segmentation quality.

    python scripts/track_figure.py --out docs/track_overlay.png
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw
from skimage import data

from sam2edge.cli.main import main as sam2edge_main
from sam2edge.runtime.video.io import read_frames
from sam2edge.weights.video import synthetic_video_state_dict

OBJ_SCORE_LIFT = 10.0  # added to the object-score head's last bias: objects stay "present" with random weights
W, H, FRAMES, STEP = 320, 240, 8, 12  # clip: a W x H window drifting STEP px right (STEP/2 down) per frame


def make_clip(folder: Path) -> None:
    """JPEG frames 00000.jpg ... of a window drifting across skimage's astronaut (512 x 512)."""
    photo = data.astronaut()
    folder.mkdir(parents=True)
    for i in range(FRAMES):
        x0, y0 = 10 + STEP * i, 10 + (STEP * i) // 2
        Image.fromarray(np.ascontiguousarray(photo[y0 : y0 + H, x0 : x0 + W])).save(folder / f"{i:05d}.jpg")


def tile(frames: list[np.ndarray], picks: list[int]) -> Image.Image:
    """Frames side by side (H x (len(picks) * W)), each labelled with its index."""
    strip = Image.new("RGB", (W * len(picks), H))
    for j, i in enumerate(picks):
        im = Image.fromarray(frames[i])
        ImageDraw.Draw(im).text((6, 4), f"frame {i}", fill=(255, 255, 255))
        strip.paste(im, (j * W, 0))
    return strip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/track_overlay.png"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_clip(root / "clip")
        sd = synthetic_video_state_dict()  # Hiera-Tiny at 1024
        sd["sam_mask_decoder.pred_obj_score_head.layers.2.bias"] += OBJ_SCORE_LIFT
        torch.save({"model": sd}, root / "lifted.pt")
        argv = ["track", str(root / "clip"), "--checkpoint", str(root / "lifted.pt"), "--point", "0:150,90"]
        argv += ["--box", "0:20,120,140,235@2", "--out", str(root / "masks"), "--overlay", str(root / "overlay.mp4")]
        print("sam2edge", " ".join(argv))
        assert sam2edge_main(argv) == 0
        frames = read_frames(root / "overlay.mp4")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tile(frames, [0, 3, 7]).save(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
