"""Export bundles: a folder of artifacts + ``card.json`` (source of truth) + ``manifest.json``.

Every target writes its bundle through ``finalize_bundle`` so that cards, manifests and the
predictor's ``from_export`` work the same for all runtimes. ``card.json`` fields:

  schema          1
  model_id        "sam2.1-hiera-tiny"
  base_model      "facebook/sam2.1-hiera-tiny"
  license         "apache-2.0"
  target          registry key of the runtime ("litert", "onnx", "executorch", ...)
  precision       "fp32" | "fp16" | "int8"
  resolution      model input side, pixels
  config          name in sam2edge.config.CONFIGS
  status          "shippable" | "rejected" (failed an accuracy bar; written only with --force)
  source          {"checkpoint", "format", "sha256"} of the weights
  tools           versions of the libraries that produced the files
  command         the command line that produced the bundle
  created         UTC date (YYYY-MM-DD)
  artifacts       [{"file", "sha256", "bytes", "role"}] model files and host tables
  fidelity        what was measured at export time (also written to fidelity.json)
  extra           target-specific facts (I/O names, op census, delegation, ...)
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata
import json
from pathlib import Path

from sam2edge.errors import UserError

CARD, MANIFEST, FIDELITY = "card.json", "manifest.json", "fidelity.json"
REQUIRED_FIELDS = ("schema", "model_id", "target", "precision", "resolution", "config", "status", "source", "artifacts")
TOOL_PACKAGES = ("torch", "litert-torch", "ai-edge-litert", "executorch", "onnx", "onnxruntime", "numpy")


def sha256_bytes(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tool_versions() -> dict[str, str]:
    out = {}
    for pkg in TOOL_PACKAGES:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def finalize_bundle(
    folder: Path,
    *,
    target: str,
    precision: str,
    resolution: int,
    config: str,
    source: dict,
    command: str,
    artifacts: dict[str, str],
    fidelity: dict,
    status: str = "shippable",
    extra: dict | None = None,
) -> dict:
    """Write fidelity.json, card.json and manifest.json into ``folder`` (already holding ``artifacts``).

    artifacts: file name -> role ("encoder", "decoder", "prompt-table", ...).
    """
    folder = Path(folder)
    arts = []
    for name, role in artifacts.items():
        p = folder / name
        arts.append({"file": name, "role": role, "sha256": sha256_bytes(p), "bytes": p.stat().st_size})
    write_json(folder / FIDELITY, fidelity)
    card = {
        "schema": 1,
        "model_id": "sam2.1-hiera-tiny",
        "base_model": "facebook/sam2.1-hiera-tiny",
        "license": "apache-2.0",
        "target": target,
        "precision": precision,
        "resolution": resolution,
        "config": config,
        "status": status,
        "source": source,
        "tools": tool_versions(),
        "command": command,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        "artifacts": arts,
        "fidelity": fidelity,
        "extra": extra or {},
    }
    write_json(folder / CARD, card)
    write_manifest(folder)
    return card


def write_manifest(folder: Path) -> dict:
    """manifest.json: every file under ``folder`` (but the manifest) with SHA-256 and size."""
    folder = Path(folder)
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            rel = p.relative_to(folder).as_posix()
            files[rel] = {"sha256": sha256_bytes(p), "bytes": p.stat().st_size}
    manifest = {"files": files}
    write_json(folder / MANIFEST, manifest)
    return manifest


def load_card(folder: Path) -> dict:
    """Read and validate card.json; a malformed card is a one-line UserError naming the field."""
    path = Path(folder) / CARD
    if not path.is_file():
        raise UserError(f"{folder} has no {CARD}; pass a bundle folder written by `sam2edge export`")
    try:
        card = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON (line {e.lineno}: {e.msg}); re-run the export") from None
    if not isinstance(card, dict):
        raise UserError(f"{path} must hold a JSON object; re-run the export")
    for field in REQUIRED_FIELDS:
        if field not in card:
            raise UserError(f"{path} is missing field '{field}'; re-run the export")
    if not isinstance(card["artifacts"], list) or not all(isinstance(a, dict) and "file" in a for a in card["artifacts"]):
        raise UserError(f"{path} field 'artifacts' must be a list of {{file, sha256, bytes}}; re-run the export")
    return card
