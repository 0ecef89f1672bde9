#!/usr/bin/env bash
# The lint, type and import gate (run by scripts/test.sh before the tests): ruff on bench/ and
# tests/ and mypy on bench/, with the rules and settings in pyproject.toml, and import-linter's
# contracts (the core imports no I/O layer; each stage only the stages below it).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check --output-format concise bench tests
.venv/bin/mypy
# Its banner is noise in a CI log; the contract lines and any broken import chain are kept.
.venv/bin/lint-imports --no-cache | grep -E "KEPT|BROKEN|^- |^    |Contracts:"
echo "lint: ruff, mypy and import contracts pass"
