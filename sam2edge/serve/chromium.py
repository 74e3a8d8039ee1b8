"""Headless Debian chromium, driven by Python playwright (never ``playwright install``: it downloads a browser).

Flags are the ones measured to work here (shared NOTES, "Models run inside headless Chromium"): WebGPU on
SwiftShader's Vulkan device (adapter architecture "swiftshader", a fallback adapter, 15-100x slower than
wasm: for correctness, not speed), plus the flags that keep a root, offline chromium quiet.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from sam2edge.errors import UserError

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
QUIET_FLAGS = [
    "--no-sandbox",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WEBGPU_FLAGS = [
    "--enable-unsafe-webgpu",
    "--enable-features=Vulkan,WebGPU",
    "--use-webgpu-adapter=swiftshader",
    "--use-vulkan=swiftshader",
    "--use-angle=swiftshader",
    "--enable-unsafe-swiftshader",
]
SWIFTSHADER_ICD = "/usr/lib/chromium/vk_swiftshader_icd.json"
# WebGPU on the machine's own GPU through Vulkan (the Vulkan driver found by the loader: VK_ICD_FILENAMES or the
# system's ICD files), never SwiftShader; headless, so no Vulkan surface. Not yet run on a hardware GPU here.
HARDWARE_WEBGPU_FLAGS = [
    "--enable-unsafe-webgpu",
    "--enable-features=Vulkan",
    "--use-angle=vulkan",
    "--use-vulkan=native",
    "--disable-vulkan-surface",
    "--ignore-gpu-blocklist",
]


def chromium_path() -> Path:
    """The chromium executable, or UserError naming the fix."""
    env = os.environ.get("SAM2EDGE_CHROMIUM")
    for c in ([env] if env else []) + list(CHROMIUM_CANDIDATES) + [shutil.which("chromium") or ""]:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    raise UserError(
        "chromium is not installed; run `apt-get install -y chromium libvulkan1` (scripts/setup.sh "
        "does it) or set SAM2EDGE_CHROMIUM to a Chromium/Chrome executable"
    )


def chromium_version(path: Path | None = None) -> str:
    """e.g. "156.0.8078.108" (from ``chromium --version``)."""
    out = subprocess.run([str(path or chromium_path()), "--version"], capture_output=True, text=True, timeout=60)
    for word in out.stdout.split():
        if word[:1].isdigit() and word.count(".") >= 2:
            return word
    return out.stdout.strip() or "unknown"


def launch(playwright, webgpu: bool = True):
    """A headless chromium Browser (playwright) with the flags above; WebGPU on SwiftShader if ``webgpu``."""
    env = dict(os.environ)
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")
    if webgpu and Path(SWIFTSHADER_ICD).is_file():
        env.setdefault("VK_ICD_FILENAMES", SWIFTSHADER_ICD)
    args = QUIET_FLAGS + (WEBGPU_FLAGS if webgpu else ["--disable-gpu"])
    return playwright.chromium.launch(executable_path=str(chromium_path()), headless=True, args=args, env=env)
