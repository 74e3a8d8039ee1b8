"""``sam2edge web``: a self-contained static folder any host serves, every model stage in the page.

Layout written under ``out``:
  index.html, site.js, litert.js, sam.js, style.css   the page (``static/``), relative URLs only
  encoder.js                                          a photo's preprocessing (shared with ``serve``'s page)
  pipeline.js, tracker.js, camera.js, record.js       tracking a clip or the camera (a ``--video`` bundle)
  vendor/@litertjs/{core,wasm-utils}/                 LiteRT.js copied from node_modules (package.json, dist, wasm)
  model/                                              the bundle's files the page runs, card.json, manifest.json
  config.json                                         what the page loads: graphs, I/O order, resolution, tracker
  README.md                                           how to serve it (COOP/COEP) and the single-thread fallback
  sam2edge-site.json                                  the marker that lets a later run replace this folder
The page checks every model file's SHA-256 against ``model/manifest.json`` (Web Crypto) before use.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from sam2edge.bundle.card import verify_manifest
from sam2edge.errors import UserError
from sam2edge.serve.assets import (
    LITERTJS_PACKAGES,
    STATIC_DIR,
    _io_order,
    _read_card,
    browser_decoder,
    browser_tracker,
    litertjs_version,
    node_modules,
)

PAGE_FILES = (  # static/ -> site root (site.html -> index.html)
    *("site.html", "site.js", "litert.js", "sam.js", "style.css"),
    *("encoder.js", "pipeline.js", "tracker.js", "camera.js", "record.js"),  # preprocessing; tracking: clip, camera
)  # static/ -> site root (site.html -> index)
MARKER = "sam2edge-site.json"  # a folder holding this file was written by this command and may be replaced
ENCODER_OUTPUTS = ("image_embeddings", "feat_s0", "feat_s1")
FILL_HOLE_AREA = 8  # Sam2VideoPredictor's default: background holes of <= 8 low-res pixels are filled
VENDOR_PARTS = ("package.json", "dist", "wasm")  # what the page loads of each LiteRT.js package

README = """# sam2edge static site

Every model stage runs in the page with LiteRT.js (WebGPU when the browser has a hardware adapter, wasm
otherwise; `?accel=wasm` or `?accel=webgpu` picks one). Serve this folder with any static host, e.g.

    python -m http.server 8000 --directory .

## Headers

Multi-threaded wasm needs a cross-origin isolated page; the host must send these two headers with every file:

    Cross-Origin-Opener-Policy: same-origin
    Cross-Origin-Embedder-Policy: require-corp

Without them the page still works: LiteRT.js runs single-threaded wasm (slower), and the page says so in
its status line ("single-threaded wasm: the host does not send COOP/COEP").

## Integrity

Before it compiles a model file the page computes its SHA-256 (Web Crypto) and compares it with
`model/manifest.json`; a file that differs is refused with a message naming it.

## Camera and video

With a bundle exported with `--video`, "Camera" and "Open video" track in the page, always on the newest frame
(frames the model cannot keep up with are dropped and counted). Browsers give the camera only to a secure page:
serve over https, or open it as http://localhost.

## Model

Bundle: {bundle} ({config}, {size} px). Tracking: {tracking}.
"""


def _check_out(out: Path) -> None:
    """Refuse an ``out`` that is a file, or a non-empty folder this command did not write."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; pass a new or empty folder (nothing was written)")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise UserError(
            f"--out {out} is a non-empty folder that `sam2edge web` did not write; pass a new or empty folder "
            "(nothing was written or overwritten)"
        )
    if (out / MARKER).is_file():
        try:
            written = set(json.loads((out / MARKER).read_text())["files"])
        except (OSError, json.JSONDecodeError, KeyError, TypeError):
            written = set()
        extra = sorted(_listing(out) - written - {MARKER})
        if extra:
            raise UserError(
                f"--out {out} holds {extra[0]}, which `sam2edge web` did not write; move it away or pass another "
                "folder (nothing was written or overwritten)"
            )


def _listing(folder: Path) -> set[str]:
    """Every file under ``folder``, relative, POSIX-style."""
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink()}


def site_config(bundle: Path) -> tuple[dict, list[str]]:
    """(config.json for the page, bundle files the page needs) for a LiteRT bundle; UserError when it has none."""
    decoder, why = browser_decoder(bundle)
    if decoder is None:
        raise UserError(f"{why}; export it with `sam2edge export --target litert`")
    if not (bundle / "encoder.tflite").is_file():
        hint = "export it with `sam2edge export --target litert`"
        raise UserError(f"the bundle {bundle.name} has no encoder.tflite; {hint}")
    card = _read_card(bundle)
    extra = card.get("extra") or {}
    _, enc_out = _io_order(extra, "encoder.tflite", ("image",), ENCODER_OUTPUTS)
    tracker, tracker_note = browser_tracker(bundle)  # EdgeTAM's tracker lists the perceiver's latents table too
    files = sorted({"encoder.tflite", *decoder.files, *(tracker.files if tracker else ())})
    cfg = {
        "bundle": bundle.name,
        "config": card.get("config"),
        "resolution": int(card.get("image_size") or extra.get("image_size") or 0),
        "encoder": {"url": "model/encoder.tflite", "outputs": list(enc_out)},
        "decoder": decoder.describe("model/"),
        "tracker": tracker.describe("model/") if tracker else None,
        "tracker_note": tracker_note or "",
        "manifest": "model/manifest.json",
        "litertjs": litertjs_version(),
    }
    return cfg, files


def write_site(bundle: str | Path, out: str | Path) -> Path:
    """Write the static site for ``bundle`` into ``out`` (staged next to it, then moved in place)."""
    bundle, out = Path(bundle), Path(out)
    if not (bundle / "card.json").is_file():
        raise UserError(f"{bundle} is not a bundle folder (no card.json); pass a folder from `sam2edge export`")
    _check_out(out)
    problems = verify_manifest(bundle)
    if problems:
        raise UserError(f"the bundle {bundle} fails its manifest ({problems[0]}); re-export it")
    nm = node_modules()
    if nm is None:
        raise UserError("LiteRT.js is not installed; run `npm ci` at the repository root (scripts/setup.sh)")
    cfg, files = site_config(bundle)
    if not cfg["resolution"]:
        cfg["resolution"] = _resolution(bundle)
    cfg["resolutions"] = [cfg["resolution"]]  # the model resolutions the bundle offers (the page's picker)
    cfg["model"] = _model_facts(bundle, cfg["resolution"])
    manifest = json.loads((bundle / "manifest.json").read_text())["files"]
    stage = out.parent / f".{out.name}.new"
    shutil.rmtree(stage, ignore_errors=True)
    try:
        stage.mkdir(parents=True)
        for name in PAGE_FILES:
            shutil.copyfile(STATIC_DIR / name, stage / ("index.html" if name == "site.html" else name))
        for pkg in LITERTJS_PACKAGES:
            for part in VENDOR_PARTS:
                src = nm / pkg / part
                if src.is_dir():
                    shutil.copytree(src, stage / "vendor" / pkg / part)
                elif src.is_file():
                    (stage / "vendor" / pkg).mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, stage / "vendor" / pkg / part)
        (stage / "model").mkdir()
        for name in [*files, "card.json"]:
            shutil.copyfile(bundle / name, stage / "model" / name)
        kept = {n: manifest[n] for n in [*files, "card.json"]}
        (stage / "model" / "manifest.json").write_text(json.dumps({"files": kept}, indent=1))
        (stage / "config.json").write_text(json.dumps(cfg, indent=1))
        tracking = "yes (video graphs)" if cfg["tracker"] else "no: " + cfg["tracker_note"]
        text = README.format(bundle=bundle.name, config=cfg["config"], size=cfg["resolution"], tracking=tracking)
        (stage / "README.md").write_text(text)
        listing = sorted(_listing(stage))
        (stage / MARKER).write_text(json.dumps({"bundle": str(bundle.resolve()), "files": listing}))
        if out.exists():
            shutil.rmtree(out)  # empty, or a site this command wrote (checked above)
        stage.rename(out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return out


def _model_facts(bundle: Path, resolution: int) -> dict:
    """What tracking in the page needs besides the graphs: widths, mask side, upstream's mask-selection constants."""
    from sam2edge.config import CONFIGS

    cfg = CONFIGS.get(str(_read_card(bundle).get("config")))
    if cfg is None:
        return {}
    e = resolution // 16  # image_embedding_size at this resolution
    return {
        "d_model": cfg.d_model,
        "embed_size": e,
        "mask_side": 4 * e,
        "stability": {"delta": cfg.stability_delta, "thresh": cfg.stability_thresh},
        "fill_hole_area": FILL_HOLE_AREA,
    }


def _resolution(bundle: Path) -> int:
    """The model's input side S from the card's config name (``sam2edge.config.CONFIGS``)."""
    from sam2edge.config import CONFIGS

    card = _read_card(bundle)
    cfg = CONFIGS.get(str(card.get("config")))
    if cfg is None:
        raise UserError(f"{bundle}/card.json names an unknown config {card.get('config')!r}; re-export the bundle")
    return int(cfg.image_size)
