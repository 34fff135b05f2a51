#!/usr/bin/env bash
# Serves the documentation site at http://127.0.0.1:8000, rebuilt on every change; the
# reference pages are generated from the code at each build (docs/hooks/reference.py).
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/mkdocs serve --strict "$@"
