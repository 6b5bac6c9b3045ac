#!/usr/bin/env bash
# The Spark tests at full size (CI=true runs them in a bounded form: fewer partitions in
# the wide write). Usage: scripts/spark_long.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
unset CI
exec env PYTHONPATH=src "$PYTHON" -m pytest tests/spark -q -p no:cacheprovider --durations=25 "$@"
