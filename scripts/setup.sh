#!/usr/bin/env bash
# Creates .venv and installs the orchestrator with the given extras (default: none).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v java >/dev/null 2>&1; then
  echo "Java 17 or newer is required (Spark runs on it): install it, e.g. apt-get install openjdk-17-jre-headless" >&2
  exit 1
fi
java_major=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/.*java.specification.version = \([0-9]*\).*/\1/p')
if [ "${java_major:-0}" -lt 17 ]; then
  echo "Java 17 or newer is required, found ${java_major:-unknown}: install openjdk-17-jre-headless" >&2
  exit 1
fi
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
extras=${1:-}
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".${extras:+[$extras]}"
