#!/usr/bin/env bash
# Sets up (if needed) and runs the smoke matrix; exits with regbench's exit code.
# The servers run side by side, one per CPU this shell may use (up to the matrix's four cells),
# each pinned to its CPU by the device slots (`--devices`): a boot is mostly one interpreter
# importing torch and vLLM, which one core carries as fast as all of them, so on 2 cores the eight
# boots take about half the wall time of one after another (docs/measurements.md). Arguments go
# to `regbench run`; a --devices of your own replaces this one.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
bash "$ROOT/scripts/setup.sh" --smoke
cd "$ROOT"
devices=$(.venv/bin/python -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0))[:4])))')
exec .venv/bin/regbench run configs/cpu-smoke.yaml --devices "$devices" "$@"
