"""The bundle format (below ``runtime`` and ``export``): card.json, manifest.json, fidelity.json."""

from sam2edge.bundle.card import (
    CARD,
    FIDELITY,
    MANIFEST,
    check_artifacts,
    finalize_bundle,
    load_card,
    open_bundle,
    record_fidelity,
    require_intact,
    rewrite_metadata,
    sha256_bytes,
    tool_versions,
    verify_manifest,
    write_json,
    write_manifest,
)
from sam2edge.bundle.fidelity import all_finite, validate_fidelity

__all__ = [
    "CARD",
    "FIDELITY",
    "MANIFEST",
    "all_finite",
    "check_artifacts",
    "finalize_bundle",
    "load_card",
    "open_bundle",
    "record_fidelity",
    "require_intact",
    "rewrite_metadata",
    "sha256_bytes",
    "tool_versions",
    "validate_fidelity",
    "verify_manifest",
    "write_json",
    "write_manifest",
]
