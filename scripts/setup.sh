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
# -qq: errors only, so that a newcomer's first screen is the demo, not pip's notes; and
# setuptools' box about editable installs (a UserWarning of its build backend) is not printed.
.venv/bin/python -m pip install -qq --upgrade pip
PYTHONWARNINGS="ignore:Editable installation" \
  .venv/bin/python -m pip install -qq -e ".${extras:+[$extras]}"
# An editable install leaves the orchestrator's bytecode to its first import, which cannot write
# it where PYTHONDONTWRITEBYTECODE is set (many container and CI images set it): every kappa
# command, driver, spare and Airflow task would compile these modules again as it starts (in
# one `kappa status --json`, 113 compilations and 0.08 s). Written once here instead.
.venv/bin/python -m compileall -q orchestrator dags
# The embedded default keeps its log in a local S3 server (the npm package s3rver), installed
# beside the venv's Python where `kappa dev up` looks for it.
s3rver_version=3.7.1
if [ ! -x .venv/node/node_modules/.bin/s3rver ] \
   || ! grep -q "\"version\": \"$s3rver_version\"" .venv/node/node_modules/s3rver/package.json; then
  if ! command -v npm >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq || true
    # The lock may be held by scripts/test.sh's install of Debian packages, running meanwhile.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      -o DPkg::Lock::Timeout=300 nodejs npm >/dev/null || true
  fi
  if command -v npm >/dev/null 2>&1; then
    npm install --silent --no-fund --no-audit --prefix .venv/node "s3rver@$s3rver_version" >/dev/null
  else
    echo "npm is not installed, so neither is the durable log's S3 server: install Node.js and" \
         "npm (e.g. 'sudo apt-get install nodejs npm') and run this again, or use" \
         "'kappa dev up --memory' (a volatile log)" >&2
  fi
fi
# With the dev extras: Grafana's dashboard schema and TypeScript, which type-check the generated
# dashboard in the test suite (tests/integration/test_dashboard_schema.py).
grafana_schema_version=13.2.3
typescript_version=5.9.3
if [[ ",$extras," == *",dev,"* ]] && command -v npm >/dev/null 2>&1 \
   && ! grep -qs "\"version\": \"$grafana_schema_version\"" \
        .venv/node/node_modules/@grafana/schema/package.json; then
  npm install --silent --no-fund --no-audit --prefix .venv/node \
    "@grafana/schema@$grafana_schema_version" "typescript@$typescript_version" >/dev/null
fi
