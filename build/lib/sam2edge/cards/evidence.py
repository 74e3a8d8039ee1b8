"""The evidence a model card is rendered from: card.json, fidelity.json (validated), bench and sweep records."""

from __future__ import annotations

import json
from pathlib import Path

from sam2edge.bundle import FIDELITY
from sam2edge.bundle.fidelity import validate_stored
from sam2edge.errors import UserError
from sam2edge.targets import TARGETS as REGISTRY

README, CHART, RECORDS_DIR, SWEEP_DIR = "README.md", "latency.png", "records", "sweep"
# target -> (Hugging Face library_name, title of the runtime), from the target registry
TARGETS: dict[str, tuple[str, str]] = {name: (t.library, t.title) for name, t in REGISTRY.items()}
BENCH_FIELDS = (
    "runtime",
    "subject",
    "resolution",
    "date",
    "provenance",
    "threads",
    "encoder_ms",
    "decoder_ms",
    "first_click_ms",
    "load_s",
    "peak_rss_mb",
    "machine",
    "session",
)
SYNTHETIC = "synthetic"


def _read_json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); fix or delete it") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path} must hold a JSON object; fix or delete it")
    return obj


def read_fidelity(folder: Path, card: dict) -> dict:
    """fidelity.json (card.json ``fidelity`` when the file is absent), validated against the one schema."""
    path = folder / FIDELITY
    return validate_stored(_read_json(path) if path.is_file() else dict(card.get("fidelity") or {}), path)


def model_artifacts(card: dict) -> dict[str, str]:
    return {a["file"]: a["sha256"] for a in card["artifacts"]}


def find_bench_records(folder: Path, card: dict, search: list[Path]) -> list[tuple[Path, dict]]:
    """Bench records of this bundle (artifact SHA-256s equal) and the upstream records of their sessions."""
    want = model_artifacts(card)
    candidates = []
    for root in [folder / RECORDS_DIR, *search]:
        if root.is_dir():
            candidates += sorted(p for p in root.rglob("*.json") if p.is_file())
    mine: dict[tuple, tuple[Path, dict]] = {}
    upstream: dict[tuple, tuple[Path, dict]] = {}
    for p in candidates:
        rec = _read_json(p)
        if rec.get("kind") != "bench":
            continue
        missing = [f for f in BENCH_FIELDS if f not in rec]
        if missing:
            raise UserError(f"bench record {p} lacks field '{missing[0]}'; re-run `sam2edge bench`")
        key = (rec["session"], rec["subject"])
        if (rec.get("bundle") or {}).get("artifacts") == want:
            mine.setdefault(key, (p, rec))
        elif rec["runtime"] == "upstream-eager":
            upstream.setdefault(key, (p, rec))
    sessions = {k[0] for k in mine}
    keep = list(mine.values()) + [v for k, v in upstream.items() if k[0] in sessions]
    return sorted(keep, key=lambda pr: (pr[1]["date"], pr[1]["session"], pr[1]["runtime"] == "upstream-eager"))


def find_sweep_records(folder: Path) -> list[tuple[Path, dict]]:
    root = folder / SWEEP_DIR
    if not root.is_dir():
        return []
    return [(p, _read_json(p)) for p in sorted(root.rglob("*.json")) if p.is_file()]
