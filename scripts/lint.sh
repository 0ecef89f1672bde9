#!/usr/bin/env bash
# The lint, type and import gate (run by scripts/test.sh before the tests): ruff on bench/, faults/ and
# tests/ and mypy on bench/, with the rules and settings in pyproject.toml, and import-linter's
# contracts (the core imports no I/O layer; each stage only the stages below it), and that
# docs/matrix.md's generated key reference matches the config models (scripts/matrix_reference.py),
# and docs/judged.md's findings table the taxonomy in bench/core/verdicts.py (scripts/judged_reference.py),
# and zizmor's audits of .github/workflows (offline: no GitHub token, no network).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check --output-format concise bench tests faults
.venv/bin/mypy
# Its banner is noise in a CI log; the contract lines and any broken import chain are kept.
.venv/bin/lint-imports --no-cache | grep -E "KEPT|BROKEN|^- |^    |Contracts:"
# docs/matrix.md's key reference against the config models' field descriptions.
.venv/bin/python scripts/matrix_reference.py --check
.venv/bin/python scripts/judged_reference.py --check
.venv/bin/zizmor --offline --strict-collection --no-progress --color never .github/workflows
echo "lint: ruff, mypy, import contracts, the matrix reference, the findings reference and zizmor pass"
