#!/usr/bin/env bash
# Create .venv with everything sam2edge, its exports and its tests need. Idempotent: re-runs
# only when this file changes. Order matters (see ../shared/NOTES.md): torch first, pinned,
# so nothing pulls a CUDA build; torchvision is never installed.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian packages (checked on every run, installed only when missing; needs root, as CI runs):
# libvulkan1 + chromium give the software Vulkan device (SwiftShader) that `sam2edge gpu-check` runs on.
APT_PKGS="libvulkan1 chromium"
APT_MISSING=$(for p in $APT_PKGS; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || echo "$p"; done)
if [ -n "$APT_MISSING" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "-> apt-get install" $APT_MISSING >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $APT_MISSING >/dev/null
  else
    echo "-> warning: missing Debian packages" $APT_MISSING "(GPU check); as root: apt-get update && apt-get install -y" $APT_MISSING >&2
  fi
fi
# Front-end runtime of `sam2edge serve` / `sweep`: LiteRT.js pinned by package-lock.json, served from
# node_modules (never a CDN). Re-installed only when the lock file changes.
NPM_STAMP="node_modules/.sam2edge-$(sha256sum package-lock.json | cut -c1-16)"
if [ ! -f "$NPM_STAMP" ]; then
  if command -v npm >/dev/null; then
    echo "-> npm ci (LiteRT.js for serve / sweep)" >&2
    npm ci --no-audit --no-fund --loglevel=error && touch "$NPM_STAMP"
  else
    echo "-> warning: npm is missing: serve / sweep need it (install Node.js 18+, then re-run)" >&2
  fi
fi
VENV=.venv
STAMP="$VENV/.setup-$(sha256sum scripts/setup.sh | cut -c1-16)"
if [ -f "$STAMP" ]; then exit 0; fi
echo "-> setting up $VENV (first run takes a few minutes)" >&2
python3 -m venv "$VENV"
P="$VENV/bin/pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
$P install -q torch==2.13.0
$P install -q litert-torch==0.10.0 ai-edge-litert==2.3.0 executorch==1.5.1
# sam2edge with every feature extra (pyproject.toml; the test extra has pytest-xdist: `make test` runs two
# workers); the browser extra's playwright only drives Debian's /usr/bin/chromium (never `playwright install`)
$P install -q -e ".[export,browser,video,everything,distributed,hub,test]"
# upstream reference (tests only): sdist without its torchvision dependency
SAM2_BUILD_CUDA=0 $P install -q --no-deps --no-build-isolation sam2==1.1.0
# EdgeTAM oracles (tests only): timm without its dependencies (they would pull torchvision and a CUDA torch; the
# tests give timm an import stand-in for torchvision), and the original EdgeTAM code in a folder of its own (its
# top-level package is also named `sam2`): tests/edgetam_oracle.py runs it in a subprocess under its own sys.path
$P install -q --no-deps timm==1.0.31
$P install -q --no-deps --upgrade --target "$VENV/edgetam-original" edgetam-dimos==1.0.1
rm -f "$VENV"/.setup-*
touch "$STAMP"
echo "-> $VENV ready" >&2
