#!/usr/bin/env bash
# Sets up the bench itself: .venv, regbench and its pinned dependencies (pyproject.toml, with the
# test extra: pytest, ruff, mypy, import-linter, zizmor). All the fast tier needs
# (scripts/test.sh --fast); scripts/setup.sh runs it beside the installs of the system under test.
# Idempotent: pip reinstalls nothing that is already there. Log: .cache/setup/bench-venv.log.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
source scripts/lib.sh

bench_venv() {
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/pip install --progress-bar off -e '.[test]'
}
step "regbench and its pinned dependencies into .venv" "~5 s (~1 min the first time)" \
  "$ROOT/.cache/setup/bench-venv.log" -- bench_venv
