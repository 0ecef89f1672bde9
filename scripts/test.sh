#!/usr/bin/env bash
# Sets up (if needed), runs the lint, type and import gate (scripts/lint.sh) and the whole test
# suite, real vLLM servers included, then checks the fault table, the false-alarm table and the
# detection table it measured against docs/faults.md's (scripts/fault_table.py,
# scripts/false_alarm_table.py, scripts/detection_table.py).
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not slow"` for the fast tier.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
bash scripts/lint.sh
# Nothing in the tests is fetched from a model hub: hub ids resolve from caches the tests build.
export HF_HUB_OFFLINE=1
if [ $# -gt 0 ]; then
  exec .venv/bin/pytest "$@"
fi
# Two at a time: two vLLM servers on the 2 cores took 0.56 of the wall time of one after the
# other. A file's tests stay on one worker (--dist loadfile), so that those sharing a booted
# matrix (a module-scoped fixture) boot it once.
# Written afresh by the slow tier's real runs (the detection ledger is appended to), so a stale
# one never passes the checks below.
rm -rf results/false-alarms results/detection.json
# The slowest tests named at the end: where the CI budget goes.
.venv/bin/pytest -n 2 --dist loadfile -m "not perf" --durations 25
# Timing comparisons alone, on a machine doing nothing else: a server beside them on 2 cores
# doubles boot times and turns the comparison into noise.
.venv/bin/pytest -m perf
.venv/bin/python scripts/fault_table.py --check
.venv/bin/python scripts/false_alarm_table.py --check
.venv/bin/python scripts/detection_table.py --check
