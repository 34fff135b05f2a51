#!/usr/bin/env bash
# Installs the orchestrator and tells the whole story on the embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/kappa demo "$@"
