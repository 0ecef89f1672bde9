# Any vLLM image with a chosen runai-model-streamer version: the A/B that tells a streamer
# regression from a vLLM one (same image, streamer 0.16.0 vs >= 0.16.1).
#   docker build -f docker/streamer.Dockerfile --build-arg BASE=vllm/vllm-openai:v0.18.1 \
#     --build-arg STREAMER_VERSION=0.16.0 -t vllm-openai:v0.18.1-streamer-0.16.0 docker/
# PIP: the pip of the image's Python ("python3 -m pip" in vllm/vllm-openai images).
ARG BASE
FROM ${BASE}
ARG STREAMER_VERSION
ARG PIP="python3 -m pip"
RUN ${PIP} install --progress-bar off --no-deps --force-reinstall "runai-model-streamer==${STREAMER_VERSION}"
LABEL org.regbench.runai-model-streamer=${STREAMER_VERSION}
