"""``sam2edge web``: a self-contained static folder any host serves, every model stage in the page.

Layout written under ``out``:
  index.html, site.js, litert.js, sam.js, style.css   the page (``static/``), relative URLs only
  encoder.js                                          a photo's preprocessing (shared with ``serve``'s page)
  pipeline.js, tracker.js, camera.js, record.js       tracking a clip or the camera (a ``--video`` bundle)
  vendor/@litertjs/{core,wasm-utils}/                 LiteRT.js copied from node_modules (package.json, dist, wasm)
  model/                                              the bundle's files the page runs, card.json, manifest.json
                                                      (several bundles: model/<resolution>/..., one manifest)
  config.json                                         what the page loads: graphs, I/O order, resolution, tracker;
                                                      with several bundles ``models`` holds each resolution's entry
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

SEVERAL = """
Model resolutions offered by the page's picker: {sizes} px (one bundle each, same weights; switching reloads
the graphs and resets tracking).
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


def site_config(bundle: Path, prefix: str = "model/") -> tuple[dict, list[str]]:
    """(config.json for the page, bundle files the page needs) for a LiteRT bundle whose files the site holds under
    ``prefix``; UserError when it has none."""
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
        "resolution": int(card.get("resolution") or card.get("image_size") or extra.get("image_size") or 0),
        "encoder": {"url": prefix + "encoder.tflite", "outputs": list(enc_out)},
        "decoder": decoder.describe(prefix),
        "tracker": tracker.describe(prefix) if tracker else None,
        "tracker_note": tracker_note or "",
        "manifest": "model/manifest.json",
        "litertjs": litertjs_version(),
    }
    return cfg, files


def _entry(bundle: Path, prefix: str) -> tuple[dict, list[str]]:
    """One bundle's config.json entry (files under ``prefix``) and the files the page needs of it."""
    cfg, files = site_config(bundle, prefix)
    if not cfg["resolution"]:
        cfg["resolution"] = _resolution(bundle)
    cfg["model"] = _model_facts(bundle, cfg["resolution"])
    return cfg, files


def _check_family(bundles: list[Path]) -> None:
    """Several bundles must be one model (config and checkpoint SHA-256 of the card's source) at distinct
    resolutions; UserError naming the first that differs."""
    cards = [_read_card(b) for b in bundles]
    key = [(c.get("config"), (c.get("source") or {}).get("sha256")) for c in cards]
    for b, k in zip(bundles[1:], key[1:]):
        if k != key[0]:
            raise UserError(
                f"{b} is {k[0]} from checkpoint {str(k[1])[:12]}, {bundles[0]} is {key[0][0]} from "
                f"{str(key[0][1])[:12]}: one site offers one model's weights at several resolutions; pass bundles "
                "exported from the same checkpoint (nothing was written)"
            )
    sizes = [int(c.get("resolution") or 0) for c in cards]
    if len(set(sizes)) != len(sizes):
        twice = next(s for s in sizes if sizes.count(s) > 1)
        raise UserError(f"two bundles are at {twice} px; pass one bundle per resolution (nothing was written)")


def _check_bundles(bundles: list[Path], out: Path) -> None:
    """Every source is a bundle that passes its manifest, ``out`` is ours to write, several bundles are one model."""
    for b in bundles:
        if not (b / "card.json").is_file():
            raise UserError(f"{b} is not a bundle folder (no card.json); pass a folder from `sam2edge export`")
    _check_out(out)
    for b in bundles:
        problems = verify_manifest(b)
        if problems:
            raise UserError(f"the bundle {b} fails its manifest ({problems[0]}); re-export it")
    if len(bundles) > 1:
        _check_family(bundles)


def _copy_vendor(nm: Path, stage: Path) -> None:
    """LiteRT.js's files the page loads, from ``node_modules`` into ``stage/vendor``."""
    for pkg in LITERTJS_PACKAGES:
        for part in VENDOR_PARTS:
            src = nm / pkg / part
            if src.is_dir():
                shutil.copytree(src, stage / "vendor" / pkg / part)
            elif src.is_file():
                (stage / "vendor" / pkg).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, stage / "vendor" / pkg / part)


def write_site(bundle: str | Path | list, out: str | Path) -> Path:
    """Write the static site for ``bundle`` (a folder, or several folders: one model at several resolutions, the
    first the page's default) into ``out`` (staged next to it, then moved in place)."""
    bundles = [Path(b) for b in (bundle if isinstance(bundle, (list, tuple)) else [bundle])]
    out = Path(out)
    _check_bundles(bundles, out)
    nm = node_modules()
    if nm is None:
        raise UserError("LiteRT.js is not installed; run `npm ci` at the repository root (scripts/setup.sh)")
    if len(bundles) == 1:
        cfg, files = _entry(bundles[0], "model/")
        copies = [(bundles[0], "", files)]  # (bundle, folder under model/, files)
        cfg["resolutions"] = [cfg["resolution"]]  # the model resolutions the site offers (the page's picker)
    else:
        entries = [_entry(b, f"model/{_card_size(b)}/") for b in bundles]
        copies = [(b, f"{e['resolution']}/", files) for b, (e, files) in zip(bundles, entries)]
        cfg = dict(entries[0][0])  # the first bundle's entry is the page's default
        cfg["models"] = {str(e["resolution"]): e for e, _ in entries}
        cfg["resolutions"] = sorted(e["resolution"] for e, _ in entries)
    stage = out.parent / f".{out.name}.new"
    shutil.rmtree(stage, ignore_errors=True)
    try:
        stage.mkdir(parents=True)
        for name in PAGE_FILES:
            shutil.copyfile(STATIC_DIR / name, stage / ("index.html" if name == "site.html" else name))
        _copy_vendor(nm, stage)
        (stage / "model").mkdir()
        kept = {}  # manifest keys: paths under model/
        for src, sub, files in copies:
            manifest = json.loads((src / "manifest.json").read_text())["files"]
            (stage / "model" / sub).mkdir(exist_ok=True)
            for name in [*files, "card.json"]:
                shutil.copyfile(src / name, stage / "model" / sub / name)
                kept[sub + name] = manifest[name]
        (stage / "model" / "manifest.json").write_text(json.dumps({"files": kept}, indent=1))
        (stage / "config.json").write_text(json.dumps(cfg, indent=1))
        tracking = "yes (video graphs)" if cfg["tracker"] else "no: " + cfg["tracker_note"]
        names = ", ".join(b.name for b in bundles)
        text = README.format(bundle=names, config=cfg["config"], size=cfg["resolution"], tracking=tracking)
        if len(bundles) > 1:
            text += SEVERAL.format(sizes=", ".join(map(str, cfg["resolutions"])))
        (stage / "README.md").write_text(text)
        listing = sorted(_listing(stage))
        marker = {"bundle": str(bundles[0].resolve()), "bundles": [str(b.resolve()) for b in bundles]}
        (stage / MARKER).write_text(json.dumps({**marker, "files": listing}))
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


def _card_size(bundle: Path) -> int:
    """The bundle's resolution as its card states it (else its config's)."""
    return int(_read_card(bundle).get("resolution") or 0) or _resolution(bundle)


def _resolution(bundle: Path) -> int:
    """The model's input side S from the card's config name (``sam2edge.config.CONFIGS``)."""
    from sam2edge.config import CONFIGS

    card = _read_card(bundle)
    cfg = CONFIGS.get(str(card.get("config")))
    if cfg is None:
        raise UserError(f"{bundle}/card.json names an unknown config {card.get('config')!r}; re-export the bundle")
    return int(cfg.image_size)
