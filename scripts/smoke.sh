#!/usr/bin/env bash
# Sets up (if needed) and runs the smoke matrix; exits with regbench's exit code.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
bash "$ROOT/scripts/setup.sh" --smoke
cd "$ROOT"
exec .venv/bin/regbench run configs/cpu-smoke.yaml "$@"
