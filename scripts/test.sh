#!/usr/bin/env bash
# Sets up (if needed) and runs the whole test suite, real vLLM servers included.
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not slow"` for the fast tier.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec .venv/bin/pytest "$@"
