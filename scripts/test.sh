#!/usr/bin/env bash
# Installs the orchestrator with its development tools and Airflow, then runs linters and the
# whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,airflow
# A real Prometheus server for the metrics tests, from Debian's packages.
if ! command -v prometheus >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    # Not fatal here: without it the Prometheus test says why it did not run (and fails in CI).
    apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus \
      >/dev/null || echo "could not install prometheus from Debian" >&2
  else
    echo "prometheus is not installed: run 'sudo apt-get install prometheus' (its tests will say so)" >&2
  fi
fi
export PATH="$PWD/.venv/bin:$PATH"
ruff check .
mypy
pytest "$@"
