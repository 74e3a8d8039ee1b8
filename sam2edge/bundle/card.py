"""The bundle format: a folder of artifacts + ``card.json`` (source of truth) + ``manifest.json``
(+ ``fidelity.json``, schema in ``sam2edge.bundle.fidelity``).

This layer sits below ``runtime`` and ``export``: every target writes its bundle through
``finalize_bundle``, every backend opens one through ``open_bundle`` (card validated, each artifact's
size and SHA-256 checked), and every later writer (``verify``, ``gpu-check --record``, ``card render``)
goes through ``rewrite_metadata``, which verifies the manifest first and writes card.json,
fidelity.json and manifest.json together only after everything succeeded. ``card.json`` fields:

  schema          1
  model_id        the SAM 2.1 size, e.g. "sam2.1-hiera-tiny" (config.model_id: a test config names its size)
  base_model      "facebook/" + model_id
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
  fidelity        what was measured at export time (also written to fidelity.json; `sam2edge verify` adds "verify")
  records         bench / sweep record files found in the bundle (filled by `sam2edge card render`)
  extra           target-specific facts (I/O names, op census, delegation, ...)
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata
import json
import os
from pathlib import Path

from sam2edge.config import model_id
from sam2edge.errors import UserError

CARD, MANIFEST, FIDELITY = "card.json", "manifest.json", "fidelity.json"
REQUIRED_FIELDS = ("schema", "model_id", "target", "precision", "resolution", "config", "status", "source", "artifacts")


def _is_sha(v: object) -> bool:
    return v is None or (isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v))


# field -> (check, what it must be), applied after REQUIRED_FIELDS are known present
FIELD_CHECKS = (
    ("schema", lambda v: v == 1, "1"),
    ("model_id", lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    ("target", lambda v: isinstance(v, str) and v != "", "a runtime name such as 'litert'"),
    ("precision", lambda v: v in ("fp32", "fp16", "int8"), "'fp32', 'fp16' or 'int8'"),
    (
        "resolution",
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0 and v % 32 == 0,
        "a positive multiple of 32",
    ),
    ("config", lambda v: isinstance(v, str) and v != "", "a config name such as 'sam2.1-hiera-tiny'"),
    ("status", lambda v: isinstance(v, str) and v != "", "a status such as 'shippable' or 'rejected'"),
    (
        "source",
        lambda v: isinstance(v, dict) and isinstance(v.get("checkpoint"), str) and _is_sha(v.get("sha256")),
        "{checkpoint, format, sha256}",
    ),
    (
        "artifacts",
        lambda v: all(isinstance(a.get("file"), str) and a.get("sha256") and _is_sha(a["sha256"]) for a in v),
        "a list of {file, sha256 (64 hex), bytes}",
    ),
)
NOT_LISTED = ": not listed in the manifest"
BASE_MODELS = {"edgetam": "facebook/EdgeTAM"}  # model_id -> its hub repository, where not facebook/<model_id>
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


def record_fidelity(folder: Path, keys: tuple[str, ...], entry: dict, rerun: str) -> dict:
    """Store ``entry`` at ``keys`` (e.g. ("checks", "gpu_delegate")) in a bundle's fidelity.json (empty when
    absent; other entries kept), mirror the document into card.json ``fidelity`` and rewrite manifest.json.
    ``rerun`` names the command to run again after deleting a broken fidelity.json. Returns the document.
    Used by ``verify`` and ``gpu-check --record``; a modified bundle is refused before anything is written."""
    folder = Path(folder)
    card = load_card(folder)
    path = folder / FIDELITY
    fidelity = {}
    if path.is_file():
        try:
            fidelity = json.loads(path.read_text())
        except json.JSONDecodeError:
            raise UserError(f"{path} is not valid JSON; delete it and run {rerun} again") from None
        if not isinstance(fidelity, dict):
            raise UserError(f"{path} must hold a JSON object; delete it and run {rerun} again")
    node = fidelity
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise UserError(f"{path} field {key!r} must be an object; delete it and run {rerun} again")
    node[keys[-1]] = entry
    card["fidelity"] = fidelity
    rewrite_metadata(folder, card, fidelity)
    return fidelity


# files a writer regenerates from card.json / fidelity.json / records: never the reason to refuse a rewrite
DERIVED = (CARD, FIDELITY, "README.md", "latency.png")


def require_intact(folder: Path, action: str) -> None:
    """Refuse to go on when a file listed in manifest.json (model files, tables, records) is missing or
    modified, or an artifact does not match card.json: rewriting the manifest from modified bytes would
    launder the change. Files the writers regenerate (``DERIVED``) and new unlisted files are allowed."""
    folder = Path(folder)
    problems = [p for p in verify_manifest(folder) if not p.endswith(NOT_LISTED) and p.split(":")[0] not in DERIVED]
    if not problems:
        try:
            check_artifacts(folder, load_card(folder), "re-export the bundle")
        except UserError as e:
            problems = [str(e)]
    if problems:
        raise UserError(
            f"{folder} does not match its manifest ({problems[0]}); not {action}: re-export the bundle "
            "(or restore the file)"
        )


def rewrite_metadata(folder: Path, card: dict, fidelity: dict | None = None, *, checked: bool = False) -> dict:
    """Rewrite card.json (+ fidelity.json) and manifest.json of an existing bundle, together.

    The manifest is verified first (``require_intact``; ``checked=True`` when the caller already did it
    before producing ``card``); every new file is written beside its destination and renamed in place only
    after all of them were produced, so a failure leaves the bundle as it was. Returns the new manifest."""
    folder = Path(folder)
    if not checked:
        require_intact(folder, "rewriting card.json / manifest.json")
    docs = {CARD: card} if fidelity is None else {FIDELITY: fidelity, CARD: card}
    staged = {}
    try:
        for name, doc in docs.items():
            staged[name] = folder / f".{name}.new"
            write_json(staged[name], doc)
        files = _manifest_files(folder, overrides={n: p for n, p in staged.items()})
        staged[MANIFEST] = folder / f".{MANIFEST}.new"
        write_json(staged[MANIFEST], {"files": files})
        for name, tmp in staged.items():
            os.replace(tmp, folder / name)
    finally:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
    return {"files": files}


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
        "model_id": model_id(config),
        "base_model": BASE_MODELS.get(model_id(config), f"facebook/{model_id(config)}"),
        "license": "apache-2.0",
        "target": target,
        "precision": precision,
        "resolution": resolution,
        "config": config,
        "status": status,
        "source": source,
        "tools": tool_versions(),
        "command": command,
        "created": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d"),
        "artifacts": arts,
        "fidelity": fidelity,
        "records": {"bench": [], "sweep": []},
        "extra": extra or {},
    }
    write_json(folder / CARD, card)
    write_manifest(folder, known={a["file"]: {"sha256": a["sha256"], "bytes": a["bytes"]} for a in arts})
    return card


def _manifest_files(
    folder: Path, overrides: dict[str, Path] | None = None, known: dict[str, dict] | None = None
) -> dict[str, dict]:
    """name -> {sha256, bytes} of every file under ``folder`` but the manifest (and staged ``.*.new`` files);
    ``overrides`` maps a top-level name to the staged file that will replace it; ``known``: entries just
    hashed by the caller (``finalize_bundle``'s artifacts), not hashed again."""
    overrides, known = overrides or {}, known or {}
    names = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}
    names.update(overrides)
    files = {}
    for rel in sorted(names):
        p = names[rel]
        if rel == MANIFEST or (rel.startswith(".") and rel.endswith(".new")):
            continue
        entry = None if rel in overrides else known.get(rel)
        files[rel] = entry or {"sha256": sha256_bytes(p), "bytes": p.stat().st_size}
    return files


def write_manifest(folder: Path, known: dict[str, dict] | None = None) -> dict:
    """manifest.json: every file under ``folder`` (but the manifest) with SHA-256 and size (fresh bundles
    only; an existing bundle is rewritten through ``rewrite_metadata``). ``known``: name -> {sha256, bytes}
    already computed for a file as it is now."""
    folder = Path(folder)
    manifest = {"files": _manifest_files(folder, known=known)}
    write_json(folder / MANIFEST, manifest)
    return manifest


def check_artifacts(folder: Path, card: dict, hint: str) -> None:
    """Size and SHA-256 of every artifact card.json lists; a missing, truncated or modified file is a
    one-line UserError naming it (``hint``: how to fix, e.g. "re-run `sam2edge export --target onnx`")."""
    folder = Path(folder)
    for art in card["artifacts"]:
        path = folder / str(art["file"])
        if not path.is_file():
            raise UserError(f"bundle file {path} is missing; {hint}")
        size = path.stat().st_size
        if size != art.get("bytes"):
            raise UserError(
                f"bundle file {path} does not match its size / SHA-256 in card.json ({size} bytes, card.json says "
                f"{art.get('bytes')}): corrupt or modified; {hint}"
            )
        if sha256_bytes(path) != art["sha256"]:
            raise UserError(f"bundle file {path} does not match its SHA-256 in card.json: corrupt or modified; {hint}")


def open_bundle(folder: str | Path, target: str) -> dict:
    """What every backend's ``from_bundle`` does first: read + validate card.json, check that it is a
    ``target`` bundle, and check every artifact's size and SHA-256. Returns the card."""
    folder = Path(folder)
    card = load_card(folder)
    hint = f"re-run `sam2edge export --target {target}`"
    if card["target"] != target:
        raise UserError(f"{folder} is a {card['target']!r} bundle, not {target!r}; open it with its own runtime")
    check_artifacts(folder, card, hint)
    return card


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
    arts = card["artifacts"]
    if not isinstance(arts, list) or not all(isinstance(a, dict) and "file" in a for a in arts):
        raise UserError(f"{path} field 'artifacts' must be a list of {{file, sha256, bytes}}; re-run the export")
    for field, ok, want in FIELD_CHECKS:
        if not ok(card[field]):
            raise UserError(f"{path} field '{field}' is {card[field]!r}, expected {want}; re-run the export")
    return card


def verify_manifest(folder: Path) -> list[str]:
    """Check every file listed in manifest.json (SHA-256 and size) and look for unlisted files.

    Returns one line per problem, each naming the file ("" list = intact). A missing or malformed
    manifest is a UserError.
    """
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise UserError(f"{folder} has no {MANIFEST}; pass a bundle folder written by `sam2edge export`")
    try:
        files = json.loads(path.read_text())["files"]
        entries = {str(k): (str(v["sha256"]), int(v["bytes"])) for k, v in files.items()}
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError):
        want = "{'files': {name: {sha256, bytes}}}"
        raise UserError(f"{path} is malformed (needs {want}); re-export the bundle") from None
    problems = []
    for name, (sha, size) in sorted(entries.items()):
        p = folder / name
        if not p.is_file():
            problems.append(f"{name}: missing")
        elif p.stat().st_size != size:
            problems.append(f"{name}: size {p.stat().st_size} bytes != {size} in the manifest")
        elif sha256_bytes(p) != sha:
            problems.append(f"{name}: sha256 {sha256_bytes(p)[:16]}... != {sha[:16]}... in the manifest (modified)")
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and p.name != MANIFEST and rel not in entries:
            problems.append(f"{rel}{NOT_LISTED}")
    return problems
