#!/usr/bin/env bash
# Installs the orchestrator with its development tools, then runs linters and the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
export PATH="$PWD/.venv/bin:$PATH"
ruff check .
mypy
pytest "$@"
