#!/usr/bin/env bash
# Create .venv with everything sam2edge, its exports and its tests need. Idempotent: re-runs
# only when this file changes. Order matters (see ../shared/NOTES.md): torch first, pinned,
# so nothing pulls a CUDA build; torchvision is never installed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
STAMP="$VENV/.setup-$(sha256sum scripts/setup.sh | cut -c1-16)"
if [ -f "$STAMP" ]; then exit 0; fi
echo "-> setting up $VENV (first run takes a few minutes)" >&2
python3 -m venv "$VENV"
P="$VENV/bin/pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
$P install -q torch==2.13.0
$P install -q litert-torch==0.10.0 ai-edge-litert==2.3.0 executorch==1.5.1
$P install -q onnx onnxruntime onnxscript safetensors scikit-image pillow pytest ruff
# upstream reference (tests only): sdist without its torchvision dependency
$P install -q iopath hydra-core
SAM2_BUILD_CUDA=0 $P install -q --no-deps --no-build-isolation sam2==1.1.0
$P install -q --no-deps -e .
rm -f "$VENV"/.setup-*
touch "$STAMP"
echo "-> $VENV ready" >&2
