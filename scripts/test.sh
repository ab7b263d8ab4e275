#!/usr/bin/env bash
# The README's test command: bootstrap everything, run the lint and type gate
# (scripts/lint.sh), then the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/lint.sh
exec .venv/bin/python -m pytest -p no:cacheprovider -q --durations=30 "$@"
