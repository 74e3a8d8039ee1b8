"""Checkpoint reading, strict mapping into sam2edge names, the synthetic checkpoint, and writers.

Every failure raises ``WeightsError`` with a one-line message that names the problem and the fix.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

import torch

from sam2edge.config import HIERA_TINY, Sam2Config
from sam2edge.errors import UserError
from sam2edge.model import build_sam2
from sam2edge.weights.keymap import HF_ALIASES, hf_name, is_video_only
from sam2edge.weights.sizes import check_size, unreadable_checkpoint

HUB_ID = "facebook/sam2.1-hiera-tiny"
OFFICIAL_SHA256 = {
    "sam2.1_hiera_tiny.pt": "7402e0d864fa82708a20fbd15bc84245c2f26dff0eb43a4b5b93452deb34be69",
    "model.safetensors": "48c14467e5cf9e51870511feb72c89688e82dd74523142c0538b663e193ac2a7",
}
SYNTHETIC = "synthetic"
DEFAULT_CHECKPOINT = "default"  # the official weights from the hub (cached), else synthetic with one warning
HUB_FILE = "model.safetensors"
HUB_TIMEOUT_S = 3.0  # the hub reachability check gives up after this long


class WeightsError(UserError):
    """A checkpoint that cannot be read or does not match the model."""


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], str]:
    """Read a .pt (Meta, ``{"model": sd}`` or a bare state dict) or .safetensors (HF) file.

    Returns (tensors, format) with format "meta" or "hf" (detected from the key names).
    """
    path = Path(path)
    if not path.is_file():
        raise WeightsError(
            f"checkpoint {path} does not exist; pass the path of a SAM 2.1 checkpoint"
            " (sam2.1_hiera_*.pt or model.safetensors)"
        )
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd = load_file(str(path))
        else:
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
            sd = obj["model"] if isinstance(obj, dict) and "model" in obj else obj
    except Exception as e:  # noqa: BLE001 - any reader failure is a bad file to the user
        raise WeightsError(unreadable_checkpoint(path, e)) from None
    if not isinstance(sd, dict) or not sd or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise WeightsError(
            f"checkpoint {path} holds no tensor state dict;"
            " pass a SAM 2.1 checkpoint (sam2.1_hiera_*.pt or model.safetensors)"
        )
    fmt = "hf" if any(k.startswith(("vision_encoder.", "mask_decoder.")) for k in sd) else "meta"
    return sd, fmt


def _summary(kind: str, names: list[str]) -> str:
    shown = ", ".join(names[:4]) + (f", +{len(names) - 4} more" if len(names) > 4 else "")
    return f"{len(names)} {kind} ({shown})"


def to_sam2edge(sd: dict[str, torch.Tensor], fmt: str, expected: dict[str, torch.Size], source: str) -> dict:
    """Map a checkpoint's tensors onto sam2edge names, strictly.

    Missing, unexpected (not video-only) and mis-shaped keys are collected and raised together.
    """
    out, used, missing, misshaped = {}, set(), [], []
    for name, shape in expected.items():
        if fmt == "meta":
            src, row = name, None
        else:
            src, row = hf_name(name)
        if src not in sd:
            missing.append(src)
            continue
        t = sd[src] if row is None else sd[src][row : row + 1]
        used.add(src)
        if t.shape != shape:
            misshaped.append(f"{src} {tuple(t.shape)} != {tuple(shape)}")
            continue
        out[name] = t.float()
    if fmt == "hf":
        for alias, primary in HF_ALIASES.items():
            if alias in sd:
                used.add(alias)
                if primary in sd and not torch.equal(sd[alias], sd[primary]):
                    misshaped.append(f"{alias} differs from its tied copy {primary}")
    unexpected = sorted(k for k in sd if k not in used and not is_video_only(k, fmt))
    edgetam = any(".trunk.body." in k for k in expected)  # EdgeTAM's RepViT under timm names
    family, files = ("EdgeTAM", "edgetam.pt") if edgetam else ("SAM 2.1", "sam2.1_hiera_*.pt")
    problems = [
        _summary(k, v) for k, v in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)) if v
    ]
    if problems:
        raise WeightsError(
            f"checkpoint {source} does not match {family} {fmt} naming: "
            + "; ".join(problems)
            + f"; pass an unmodified {family} checkpoint ({files} or model.safetensors)"
        )
    return out


def from_sam2edge(sd: dict[str, torch.Tensor], fmt: str) -> dict[str, torch.Tensor]:
    """Inverse map: sam2edge tensors -> a state dict in Meta or HF naming (image path only)."""
    if fmt == "meta":
        return {k: v.clone() for k, v in sd.items()}
    out: dict[str, torch.Tensor] = {}
    rows: dict[int, torch.Tensor] = {}
    for name, t in sd.items():
        dst, row = hf_name(name)
        if row is None:
            out[dst] = t.clone()
        else:
            rows[row] = t
    out["prompt_encoder.point_embed.weight"] = torch.cat([rows[i] for i in sorted(rows)], dim=0)
    for alias, primary in HF_ALIASES.items():
        out[alias] = out[primary].clone()
    return out


def expected_shapes(cfg: Sam2Config = HIERA_TINY) -> dict[str, torch.Size]:
    return {k: v.shape for k, v in build_sam2(cfg).state_dict().items()}


def synthetic_state_dict(cfg: Sam2Config = HIERA_TINY, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic stand-in weights: seeded default init, every float tensor + 0.02 * randn.

    Upstream's init leaves several tensors at zero (pos embeds, tokens' effect), which makes
    whole branches vanish; the perturbation keeps every path alive so parity checks can fail.
    The masks it produces are meaningless.
    """
    torch.manual_seed(seed)
    model = build_sam2(cfg)
    g = torch.Generator().manual_seed(seed + 1)
    return {k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


def resolve_checkpoint(spec: str | None) -> str:
    """A path, a hub id (fetched only now, online), or None -> a local path or ``SYNTHETIC``."""
    if spec is None or spec == SYNTHETIC:
        return SYNTHETIC
    if spec == DEFAULT_CHECKPOINT:
        return DEFAULT_CHECKPOINT
    if Path(spec).exists():
        return spec
    if re.fullmatch(r"[\w.-]+/[\w.-]+", spec) and not spec.endswith((".pt", ".safetensors")):
        try:
            from huggingface_hub import hf_hub_download

            return hf_hub_download(spec, "model.safetensors")
        except Exception as e:  # noqa: BLE001
            reason = str(e).splitlines()[0][:100] if str(e) else type(e).__name__
            raise WeightsError(
                f"cannot fetch {spec} from the hub ({reason}); when offline, download model.safetensors"
                " elsewhere and pass its path to --checkpoint"
            ) from None
    raise WeightsError(f"checkpoint {spec} does not exist; pass a file path or a hub id such as {HUB_ID}")


def load_weights(spec: str | None, cfg: Sam2Config = HIERA_TINY) -> tuple[dict[str, torch.Tensor], dict]:
    """sam2edge state dict + provenance {"checkpoint", "format", "sha256"} for a checkpoint spec."""
    path = resolve_checkpoint(spec)
    note = None
    if path == DEFAULT_CHECKPOINT:
        path, note = resolve_default_checkpoint()
    if path == SYNTHETIC:
        prov = {"checkpoint": SYNTHETIC, "format": SYNTHETIC, "sha256": None}
        return synthetic_state_dict(cfg), {**prov, "note": note} if note else prov
    sd, fmt = read_checkpoint(path)
    check_size(sd, cfg, f"checkpoint {path}")
    mapped = to_sam2edge(sd, fmt, expected_shapes(cfg), str(path))
    check_finite(mapped, str(path))
    return mapped, {"checkpoint": str(path), "format": fmt, "sha256": sha256_file(path)}


def save_checkpoint(sd: dict[str, torch.Tensor], fmt: str, path: str | Path) -> None:
    """Write sam2edge tensors as a Meta .pt (``{"model": sd}``) or HF .safetensors, atomically."""
    path = Path(path)
    tensors = {k: v.contiguous() for k, v in from_sam2edge(sd, fmt).items()}
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    try:
        if fmt == "hf":
            from safetensors.torch import save_file

            save_file(tensors, tmp)
        else:
            torch.save({"model": tensors}, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# ---- finite weights --------------------------------------------------------------------------------
def check_finite(sd: dict[str, torch.Tensor], source: str) -> None:
    """Refuse a state dict with a NaN or infinite value, naming the tensor(s)."""
    bad = [k for k, v in sd.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise WeightsError(
            f"checkpoint {source} has NaN or infinite values in {_summary('tensors', bad)}; "
            "the file is corrupt: re-download the official checkpoint"
        )


# ---- the default checkpoint: official weights from the hub, else synthetic ------------------------------
def hub_reachable(timeout_s: float = HUB_TIMEOUT_S) -> str | None:
    """None when the hub answers a TCP connection within ``timeout_s`` (DNS included), else the reason."""
    import socket
    import threading
    import urllib.parse

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    url = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    result: list[str | None] = [f"no answer within {timeout_s:.0f} s"]

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            result[0] = None
        except OSError as e:
            result[0] = f"{host} unreachable: {e.strerror or type(e).__name__}"

    t = threading.Thread(target=probe, daemon=True)  # getaddrinfo has no timeout of its own
    t.start()
    t.join(timeout_s)
    return result[0]


def fetch_official() -> str:
    """Download (or reuse from the hub cache) the official model.safetensors, with a progress bar, and
    check its SHA-256 -> local path. Raises WeightsError on a checksum mismatch."""
    from sam2edge.extras import require

    hub = require("huggingface_hub")
    path = hub.hf_hub_download(HUB_ID, HUB_FILE)
    digest = sha256_file(path)
    if digest != OFFICIAL_SHA256[HUB_FILE]:
        raise WeightsError(
            f"{path} has SHA-256 {digest[:12]}..., not the official {OFFICIAL_SHA256[HUB_FILE][:12]}...; "
            "delete it from the hub cache (huggingface-cli delete-cache) and run again"
        )
    return path


def resolve_default_checkpoint() -> tuple[str, str | None]:
    """-> (official weights path, None) when the hub is reachable, else (SYNTHETIC, why, in a few words)."""
    reason = hub_reachable()
    if reason is None:
        try:
            return fetch_official(), None
        except WeightsError:
            raise
        except Exception as e:  # noqa: BLE001 - any hub failure means offline for the user
            reason = str(e).splitlines()[0][:100] if str(e) else type(e).__name__
    return SYNTHETIC, f"the official weights are not available ({reason})"
